"""Renderers as rule tables over one shared walk (renderer/__init__.py): every table covers the ops its target's
linear programs contain, one table entry changes how one op renders (and nothing else), an op without a rule is a
clear error, and the PYTHON interpreter's table computes what the other backends compute."""
import numpy as np
import pytest

from fusegrad import Tensor, dtypes
from fusegrad.codegen import to_program
from fusegrad.ir.ops import GroupOp, Ops
from fusegrad.renderer import TextKernel
from fusegrad.renderer.cstyle import C_ALU, ClangRenderer, CStyleLanguage
from fusegrad.renderer.cuda import CUDARenderer
from fusegrad.renderer.llvmir import ALU_RULES, LLVMRenderer
from fusegrad.renderer.metal import MetalRenderer
from fusegrad.renderer.opencl import OpenCLRenderer
from fusegrad.renderer.wgsl import WGSLRenderer
from fusegrad.runtime.ops_python import RULES

BASE = {Ops.PARAM, Ops.DEFINE_VAR, Ops.DEFINE_REG, Ops.RANGE, Ops.END, Ops.INDEX, Ops.LOAD, Ops.STORE, Ops.CONST,
        Ops.CAST, Ops.BITCAST} | GroupOp.ALU


def _ast(t: Tensor):
    items = [si for si in t.schedule() if not si.is_copy]
    assert len(items) == 1
    return items[0].ast


@pytest.mark.parametrize("cls,extra", [
    (ClangRenderer, {Ops.VECTORIZE, Ops.GEP}), (OpenCLRenderer, {Ops.VECTORIZE, Ops.GEP, Ops.SPECIAL, Ops.DEFINE_LOCAL,
                                                                  Ops.BARRIER}),
    (CUDARenderer, {Ops.SPECIAL, Ops.DEFINE_LOCAL, Ops.BARRIER}), (MetalRenderer, {Ops.SPECIAL, Ops.DEFINE_LOCAL,
                                                                                   Ops.BARRIER}),
    (WGSLRenderer, {Ops.SPECIAL}), (LLVMRenderer, {Ops.VECTORIZE, Ops.GEP})])
def test_tables_cover_the_linear_ops(cls, extra):
    assert BASE | extra <= set(cls.rules), sorted(o.name for o in BASE | extra - set(cls.rules))
    assert GroupOp.ALU <= set(cls.alu_rules)


def test_python_interpreter_table_covers_the_linear_ops():
    assert BASE <= set(RULES)


def test_c_dialects_share_the_c_tables():
    for cls in (OpenCLRenderer, CUDARenderer, MetalRenderer):
        assert cls.rules is CStyleLanguage.rules and cls.alu_rules is C_ALU
    # the CPU's C differs in two entries: a register tile's loop asks GCC to unroll it (cstyle._cpu_range), and a
    # vector made of two whole vectors is one __builtin_shufflevector (cstyle._cpu_vectorize)
    assert ClangRenderer.alu_rules is C_ALU
    assert {k for k in ClangRenderer.rules if ClangRenderer.rules[k] is not CStyleLanguage.rules.get(k)} == \
        {Ops.RANGE, Ops.VECTORIZE}
    assert ClangRenderer.rules.keys() == CStyleLanguage.rules.keys()
    assert LLVMRenderer.alu_rules is ALU_RULES


def test_one_alu_entry_changes_one_op():
    ast = _ast(Tensor([1.0, 2.0, 3.0]).realize().sqrt() + 1)

    class Shouty(ClangRenderer):
        alu_rules = {**C_ALU, Ops.SQRT: lambda c, op, dt, a, src: f"fg_sqrt_please({a[0]})"}
    plain, shouty = to_program(ast, ClangRenderer()).src, to_program(ast, Shouty()).src
    assert "fg_sqrt_please(" in shouty and "fg_sqrt_please(" not in plain
    assert shouty.replace("fg_sqrt_please(", "__builtin_sqrtf(") == plain  # nothing else changed


def test_one_walk_entry_changes_one_op_on_wgsl():
    ast = _ast(Tensor(np.ones((4, 300), dtype=np.float32)).realize().sum(1))  # a reduce loop

    def fancy_end(w, k: TextKernel, u):
        k.line("}  // end of loop")
        return ""

    class Fancy(WGSLRenderer):
        rules = {**WGSLRenderer.rules, Ops.END: fancy_end}
    plain, fancy = to_program(ast, WGSLRenderer()).src, to_program(ast, Fancy()).src
    assert "}  // end of loop" in fancy and fancy.replace("}  // end of loop", "}") == plain


@pytest.mark.parametrize("cls", [ClangRenderer, WGSLRenderer, LLVMRenderer])
def test_an_op_without_a_rule_is_a_clear_error(cls):
    ast = _ast(Tensor([1.0, 2.0]).realize() * 3)

    class NoStore(cls):
        rules = {op: r for op, r in cls.rules.items() if op is not Ops.STORE}
    with pytest.raises(RuntimeError, match=r"can't render Ops\.STORE"):
        to_program(ast, NoStore())


def test_python_interpreter_runs_loops_gates_and_casts():
    x = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    t = Tensor(x, device="PYTHON")
    got = ((t.pad(((1, 0), (0, 1))) * 2).sum(1).cast(dtypes.int32) - t.max()).numpy()
    want = (np.pad(x, ((1, 0), (0, 1))) * 2).sum(1).astype(np.int32) - x.max()
    np.testing.assert_array_equal(got, want)
    idx = Tensor([2, 0, 1], device="PYTHON")
    np.testing.assert_array_equal(t[idx].numpy(), x[[2, 0, 1]])
