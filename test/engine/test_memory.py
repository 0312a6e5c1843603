"""Memory does not grow: eager forwards through trainable layers, eager training steps and TinyJit steps keep device
memory, RSS, open file descriptors and the engine's bookkeeping flat after a warm-up."""
import gc
import os

import numpy as np

from fusegrad import Tensor, TinyJit, nn
from fusegrad.helpers import GlobalCounters
from fusegrad import storage

STEPS = 300
WARMUP = 30


def rss_mb() -> float:
    with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def no_huge_pages() -> None:
    """Keep the kernel's khugepaged away from this process (prctl PR_SET_THP_DISABLE, Linux), so RSS counts what the
    loop allocates: khugepaged fills any 2 MiB range advised for huge pages (NumPy advises its arrays from 4 MiB;
    glibc heap ranges keep the advice after a free) that has one touched page into a whole huge page, whenever it
    gets to it. (A guard, not the cause of the suite's old failure here: that was the hash-consing table's sweep,
    test/unit/test_eager_overhead.py.)"""
    import ctypes
    try: ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)   # PR_SET_THP_DISABLE
    except (OSError, AttributeError): pass          # not Linux: no khugepaged either


def measure(step):
    """(device bytes, RSS MB, fds, cache bookkeeping) after the warm-up and after STEPS more steps."""
    no_huge_pages()
    out = []
    for i in range(WARMUP + STEPS):
        step(i)
        if i in (WARMUP - 1, WARMUP + STEPS - 1):
            gc.collect()
            storage.prune()
            out.append((GlobalCounters.mem_used, rss_mb(), fds(), sum(len(v) for v in storage._cache_deps.values())))
    return out


def model():
    Tensor.manual_seed(0)
    return nn.Linear(64, 128), nn.Linear(128, 10)


def check_flat(before, after):
    mem0, rss0, fd0, deps0 = before
    mem1, rss1, fd1, deps1 = after
    assert mem1 <= mem0, f"device memory grew {mem0} -> {mem1} bytes over {STEPS} steps"
    assert rss1 - rss0 < 8, f"RSS grew {rss0:.1f} -> {rss1:.1f} MB over {STEPS} steps"
    assert fd1 <= fd0, f"open file descriptors grew {fd0} -> {fd1}"
    assert deps1 <= deps0 + 64, f"result-cache bookkeeping grew {deps0} -> {deps1}"


def test_eager_forward_through_trainable_layers_is_flat():
    l1, l2 = model()
    def step(i):
        x = Tensor(np.random.rand(256, 64).astype(np.float32))
        l2(l1(x).relu()).numpy()
    check_flat(*measure(step))


def test_eager_training_is_flat():
    l1, l2 = model()
    opt = nn.optim.Adam(nn.state.get_parameters([l1, l2]), lr=1e-3)
    x = Tensor(np.random.rand(64, 64).astype(np.float32))
    y = Tensor(np.random.randint(0, 10, 64).astype(np.int32))
    def step(i):
        with Tensor.train():
            opt.zero_grad()
            loss = l2(l1(x).relu()).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
            loss.item()
    check_flat(*measure(step))


def test_tinyjit_training_is_flat():
    l1, l2 = model()
    opt = nn.optim.Adam(nn.state.get_parameters([l1, l2]), lr=1e-3)

    @TinyJit
    def train(x, y):
        with Tensor.train():
            opt.zero_grad()
            loss = l2(l1(x).relu()).sparse_categorical_crossentropy(y)
            loss.backward()
            return loss.realize(*opt.schedule_step())
    def step(i):
        x = Tensor(np.random.rand(64, 64).astype(np.float32))
        y = Tensor(np.random.randint(0, 10, 64).astype(np.int32))
        train(x, y).item()
    check_flat(*measure(step))
