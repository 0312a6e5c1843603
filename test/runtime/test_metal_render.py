"""METAL backend without a Mac: every kernel of a representative set (test/runtime/kernel_corpus.py) rendered as Metal
Shading Language with the right structure (kernel signature, buffer bindings, thread-position ids, no 64-bit float),
float64 rejected with a clear error, and a C++ syntax check of every kernel against a stub of the Metal types (g++, not
the Metal compiler: that needs xcrun on macOS). Opening METAL elsewhere is a clear error."""
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from kernel_corpus import kernel_asts, uses_dtype

from fusegrad import Device, Tensor, dtypes
from fusegrad.codegen import to_program
from fusegrad.renderer.metal import MetalRenderer

# just enough of metal_stdlib for g++ to parse the kernels: address spaces vanish, attributes are ignored
METAL_STUB = r"""#include <cmath>
#include <cstring>
#define kernel
#define device
#define constant
typedef unsigned char uchar; typedef unsigned short ushort; typedef unsigned int uint; typedef unsigned long ulong;
typedef _Float16 half;
struct uint3 { uint x, y, z; };
template <class T, class F> T as_type(F x) { static_assert(sizeof(T) == sizeof(F)); T y; memcpy(&y, &x, sizeof(T)); return y; }
namespace metal { using std::trunc; namespace precise { using std::sqrt; using std::exp2; using std::log2; using std::sin; } }
"""


@pytest.fixture(scope="module")
def rendered() -> list[tuple[str, object, str]]:
    """(program, ProgramSpec, error) per corpus kernel: error is the message of a render that raised, else ''."""
    out = []
    for label, ast in kernel_asts():
        try: out.append((label, to_program(ast, MetalRenderer()), ""))
        except RuntimeError as e: out.append((label, ast, str(e)))
    return out


def test_every_kernel_renders_except_float64(rendered):
    ok = [label for label, spec, err in rendered if not err]
    assert len(ok) >= 140 and len(rendered) - len(ok) >= 10, (len(ok), len(rendered))
    for label, spec, err in rendered:
        if err: assert "Metal has no 64-bit float" in err and uses_dtype(spec, dtypes.float64), f"{label}: {err}"
        else: assert not any(uses_dtype(u, dtypes.float64) for u in spec.uops), label


def test_kernel_structure(rendered):
    assert sum("constant int& n [[buffer(2)]]" in spec.src for _, spec, err in rendered if not err) >= 2  # Variables
    for label, spec, err in rendered:
        if err: continue
        src = spec.src
        assert src.startswith("#include <metal_stdlib>\nusing namespace metal;\n"), label
        sig = re.search(rf"kernel void {spec.name}\((.*)\) {{", src)
        assert sig, f"{label}: {spec.name}"
        args = sig.group(1).split(", ")
        buffers = [a for a in args if a.startswith("device ")]
        assert len(buffers) == spec.nbufs, f"{label}: {sig.group(1)}"
        for i, a in enumerate(buffers): assert re.fullmatch(rf"device \w+\* data{i} \[\[buffer\({i}\)\]\]", a), a
        ints = [a for a in args if a.startswith("constant ")]  # Variables, bound after the buffers
        for i, a in enumerate(ints, spec.nbufs): assert re.fullmatch(rf"constant int& \w+ \[\[buffer\({i}\)\]\]", a), a
        assert len(buffers) + len(ints) + sum(a.startswith("uint3 ") for a in args) == len(args), sig.group(1)
        for arg, attr in (("fg_gid", "thread_position_in_grid"), ("fg_lid", "thread_position_in_threadgroup")):
            assert (f"uint3 {arg} [[{attr}]]" in args) == (f"{arg}." in src), f"{label}: {arg}"
        for word in ("double", "bfloat", "restrict", "__"):  # no 64-bit float, no MSL 3.1 bfloat, no C/CUDA-isms
            assert word not in src, f"{label}: {word!r} in\n{src}"


def test_float64_is_rejected_clearly():
    (si,) = (Tensor(np.ones(4)) * 2).schedule()
    with pytest.raises(RuntimeError, match="Metal has no 64-bit float: float64 can't run on METAL"):
        to_program(si.ast, MetalRenderer())


def test_source_details():
    x = Tensor(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    (si,) = (x.permute(2, 1, 0).bitcast(dtypes.int32).cast(dtypes.int64) * 3_000_000_000).schedule()
    src = to_program(si.ast, MetalRenderer()).src
    assert "kernel void E_4_3_2(device long* data0 [[buffer(0)]], device float* data1 [[buffer(1)]], " \
           "uint3 fg_gid [[thread_position_in_grid]])" in src
    assert "int gid2 = (int)fg_gid.z;" in src and "as_type<int>(" in src and "3000000000l" in src
    (si,) = (Tensor([1.0, 2.0]) > 1).schedule()
    assert "device uchar* data0" in to_program(si.ast, MetalRenderer()).src  # bool buffers are bytes
    (si,) = Tensor([1.0, 2.0]).maximum(Tensor([0.0, float("nan")])).schedule()
    assert "!=" in to_program(si.ast, MetalRenderer()).src                   # NaN-propagating max


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ isn't installed")
def test_every_kernel_parses_as_cpp_against_a_metal_stub(rendered, tmp_path):
    """One translation unit, each kernel in its own namespace: catches syntax errors and undeclared names."""
    parts = [METAL_STUB]
    for i, (label, spec, err) in enumerate(rendered):
        if err: continue
        body = spec.src.replace("#include <metal_stdlib>\nusing namespace metal;\n", "")
        parts.append(f"namespace k{i} {{ // {label}\n{body}}}")
    path = tmp_path / "kernels.cpp"
    path.write_text("\n".join(parts))
    p = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-Wno-attributes", str(path)], capture_output=True,
                       text=True, timeout=240, check=False)
    assert p.returncode == 0 and p.stderr == "", p.stderr[:3000]


@pytest.mark.skipif(shutil.which("xcrun") is None, reason="xcrun (Apple's Metal compiler) isn't available: "
                                                           "compiling MSL needs macOS with Xcode")
def test_every_kernel_compiles_with_xcrun_metal(rendered, tmp_path):
    for i, (label, spec, err) in enumerate(rendered):
        if err: continue
        path = tmp_path / f"k{i}.metal"
        path.write_text(spec.src)
        p = subprocess.run(["xcrun", "-sdk", "macosx", "metal", "-c", str(path), "-o", str(tmp_path / f"k{i}.air")],
                           capture_output=True, text=True, timeout=60, check=False)
        assert p.returncode == 0, f"{label}: {p.stderr}"


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS METAL may open")
def test_opening_metal_off_macos_is_a_clear_error():
    with pytest.raises(RuntimeError, match="METAL needs macOS with a Metal GPU"):
        Device["METAL"]
