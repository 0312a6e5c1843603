"""A few fixed programs of the differential program fuzzer (programs.py): each runs by default, in reference mode and in
PyTorch, and every output, parameter and buffer must agree. Together these seeds use every kind of step (train, eval,
accum, views, lazy reads, DLPack, DISK, safetensors, shards); 1042 and 5005 are SGD programs without optimizer state
that each hit one TinyJit staleness bug. The long run: `PYTHONPATH=. python test/fuzz/programs.py --n 2000`.

Each of 100, 334, 150, 1042 and 5005 failed before the fixes of issue 28 (Adam/AdamW state of parameters with the
same shape realized together shared one buffer; 334 also ran a sharded pending write twice; 1042: a jitted eval replayed
a weight relayout captured before the optimizer step; 5005: a replayed micro-batch function read parameters as they
were before another jitted function updated them). All seven pass now."""
import numpy as np
import pytest

from .programs import STEP_WEIGHTS, TIGHT, Result, check, first_mismatch, generate, render

pytest.importorskip("torch")

SEEDS = [100, 334, 230, 150, 19, 1042, 5005]


def test_ci_seeds_cover_every_step_kind():
    used = {st[0] for s in SEEDS for st in generate(s).steps}
    assert used == set(STEP_WEIGHTS), f"not covered: {set(STEP_WEIGHTS) - used}"


def test_programs_are_reproducible():
    assert render(generate(7)) == render(generate(7))
    assert render(generate(7)) != render(generate(8))


def test_comparison_catches_a_difference():
    a = Result([("end fc.bias", np.array([1.0, 2.0], np.float32)), ("end n", np.array(3))], None)
    b = Result([("end fc.bias", np.array([1.0, 2.01], np.float32)), ("end n", np.array(3))], None)
    c = Result([("end fc.bias", np.array([1.0, 2.0], np.float32)), ("end n", np.array(4))], None)
    assert first_mismatch(a, a, TIGHT) is None
    assert first_mismatch(a, b, TIGHT).startswith("end fc.bias")
    assert first_mismatch(a, c, TIGHT).startswith("end n")   # integers exactly


@pytest.mark.parametrize("seed", SEEDS)
def test_program(seed):
    prog = generate(seed)
    found = check(prog)
    assert not found, render(prog) + "\n" + "\n".join(f"[{sig}] {detail}" for sig, detail in found)
