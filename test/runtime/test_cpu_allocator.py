"""The CPU allocator's huge pages (runtime/ops_cpu.py): `huge_page_bytes` reads Linux's transparent-huge-page
settings, and a buffer of at least two huge pages is aligned to one (so madvise can back it with them) and holds what
is written to it; smaller buffers keep the usual alignment."""
import ctypes

import pytest

from fusegrad.runtime.ops_cpu import CPUAllocator, huge_page_bytes

MB2 = 2 << 20


@pytest.mark.parametrize("mode,size,want", [("always [madvise] never\n", "2097152\n", MB2),
                                            ("[always] madvise never\n", "2097152\n", MB2),
                                            ("always madvise [never]\n", "2097152\n", 0),
                                            ("always [madvise] never\n", "garbage\n", 0),
                                            ("always [madvise] never\n", "3000000\n", 0),   # not a power of two
                                            (None, None, 0)])   # no THP in this kernel (or not Linux)
def test_huge_page_bytes_reads_sysfs(tmp_path, mode, size, want):
    if mode is not None: (tmp_path / "enabled").write_text(mode)
    if size is not None: (tmp_path / "hpage_pmd_size").write_text(size)
    assert huge_page_bytes(str(tmp_path)) == want


@pytest.mark.parametrize("nbytes,aligned", [(2 * MB2, True), (5 * MB2 + 12, True), (MB2, False), (4096, False)])
def test_big_buffers_are_aligned_to_a_huge_page(nbytes, aligned):
    alloc = CPUAllocator(huge_page=MB2)
    if alloc.madvise is None: pytest.skip("no madvise in this C library")
    ptr = alloc.alloc(nbytes)
    try:
        assert ptr % 64 == 0
        if aligned: assert ptr % MB2 == 0
        data = bytes(range(256)) * (nbytes // 256) + bytes(nbytes % 256)
        alloc._copyin(ptr, memoryview(data))
        out = bytearray(nbytes)
        alloc._copyout(memoryview(out), ptr)
        assert out == data and ctypes.c_ubyte.from_address(ptr + nbytes - 1).value == data[-1]
    finally: alloc.free(ptr, nbytes)


def test_without_huge_pages_nothing_changes():
    alloc = CPUAllocator(huge_page=0)
    assert alloc.madvise is None
    ptr = alloc.alloc(4 * MB2)
    assert ptr % 64 == 0
    alloc.free(ptr, 4 * MB2)


def test_a_freed_huge_page_buffer_is_unmapped():
    """A huge-page buffer is a mapping of its own: freed, it leaves the process (no heap range keeps its advice, for
    khugepaged to fill into huge pages later)."""
    alloc = CPUAllocator(huge_page=MB2)
    if alloc.madvise is None: pytest.skip("no mmap/madvise in this C library")

    def mapped(ptr: int) -> bool:
        with open("/proc/self/maps") as f:
            for line in f:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= ptr < hi: return True
        return False
    for _ in range(3):   # (glibc serves a size it once unmapped from its heap after that: its mmap threshold grows)
        ptr = alloc._alloc(3 * MB2 + 100)
        assert ptr % MB2 == 0 and mapped(ptr) and mapped(ptr + 3 * MB2 + 99)
        ctypes.memset(ptr, 7, 3 * MB2 + 100)
        alloc._free(ptr, 3 * MB2 + 100)
        assert not mapped(ptr) and not mapped(ptr + 3 * MB2)


def test_huge_pages_are_opt_in():
    """The device's allocator gives no huge pages unless CPU_HUGE_PAGES=1 (they gained little on two cores, and a
    first touch may wait for the kernel to compact memory: docs/performance.md)."""
    import os
    import subprocess
    import sys
    code = "from fusegrad.runtime.ops_cpu import CPUAllocator; print(CPUAllocator().huge_page)"
    env = {k: v for k, v in os.environ.items() if k != "CPU_HUGE_PAGES"}
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert off.returncode == 0 and off.stdout.strip() == "0", off.stderr[-2000:]
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                        env={**env, "CPU_HUGE_PAGES": "1"})
    assert on.returncode == 0 and on.stdout.strip() == str(huge_page_bytes()), on.stderr[-2000:]
