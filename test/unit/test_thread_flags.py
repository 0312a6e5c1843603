"""Context(...) overrides and Tensor.train() are per thread: another thread keeps seeing its own values."""
from __future__ import annotations

import threading

from fusegrad import Tensor
from fusegrad.helpers import DEV, TRAINING, Context


def _in_thread(fn):
    out = []
    th = threading.Thread(target=lambda: out.append(fn()))
    th.start()
    th.join()
    return out[0]


def test_context_override_stays_in_its_thread():
    base = DEV.value
    with Context(DEV="PYTHON"):
        assert DEV.value == "PYTHON"
        assert _in_thread(lambda: DEV.value) == base        # saw "PYTHON" before
    assert DEV.value == base


def test_train_stays_in_its_thread():
    assert Tensor.training is False
    with Tensor.train():
        assert Tensor.training is True and TRAINING.value == 1
        assert _in_thread(lambda: (Tensor.training, TRAINING.value)) == (False, 0)
        with Tensor.test():
            assert Tensor.training is False
        assert Tensor.training is True
    assert Tensor.training is False and TRAINING.value == 0


def test_training_assignment_and_flag_agree():
    Tensor.training = True
    try:
        assert TRAINING.value == 1 and _in_thread(lambda: Tensor.training) is False
    finally:
        Tensor.training = False
    with Context(TRAINING=1):
        assert Tensor.training is True


def test_threads_train_concurrently():
    # each thread's mode is its own even when the blocks overlap in time
    seen, barrier = {}, threading.Barrier(2)

    def worker(mode: bool):
        with Tensor.train(mode):
            barrier.wait()
            seen[mode] = Tensor.training
            barrier.wait()
    ths = [threading.Thread(target=worker, args=(m,)) for m in (True, False)]
    for t in ths: t.start()
    for t in ths: t.join()
    assert seen == {True: True, False: False}


def test_decorated_function_restores():
    @Tensor.train()
    def f(): return Tensor.training
    assert f() is True and Tensor.training is False
    assert _in_thread(f) is True and Tensor.training is False
