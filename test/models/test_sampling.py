"""Sampling (fusegrad/models/decoding.py) against transformers' logits processors doing the same steps (repetition
penalty, temperature, top-k, top-p): the same tokens kept, the same probabilities; seeded draws repeat; bad settings
raise; Generator streams with host-side sampling, TinyJit on and off."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusegrad.models.decoding import Generator, Sampling
from fusegrad.models.gpt2 import GPT2, GPT2Config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def reference_probs(logits: np.ndarray, history: list[int], s: Sampling) -> np.ndarray:
    from transformers import (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
                              TopPLogitsWarper)
    x = torch.tensor(logits[None])
    ids = torch.tensor([history], dtype=torch.long) if history else torch.zeros((1, 0), dtype=torch.long)
    if s.repetition_penalty != 1 and history: x = RepetitionPenaltyLogitsProcessor(s.repetition_penalty)(ids, x)
    x = TemperatureLogitsWarper(s.temperature)(ids, x)
    if s.top_k: x = TopKLogitsWarper(s.top_k)(ids, x)
    if s.top_p < 1: x = TopPLogitsWarper(s.top_p)(ids, x)
    return torch.softmax(x.double(), -1)[0].numpy()


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 60), st.floats(0.1, 3.0), st.integers(0, 70), st.floats(0.05, 1.0), st.floats(0.5, 2.0),
       st.integers(0, 2 ** 31 - 1))
def test_probabilities_equal_transformers(V, temperature, top_k, top_p, penalty, seed):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(V) * 3).astype(np.float32)
    history = rng.integers(0, V, size=rng.integers(0, 6)).tolist()
    s = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=penalty)
    got, want = s.probabilities(logits, history), reference_probs(logits, history, s)
    assert np.array_equal(got > 0, want > 0), (got, want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)


def test_pick():
    logits = np.array([0.5, 2.0, 1.0, -1.0], dtype=np.float32)
    assert Sampling().pick(logits, [], np.random.default_rng(0)) == 1
    assert Sampling(repetition_penalty=5.0).pick(logits, [1], np.random.default_rng(0)) == 2     # 2.0 / 5 < 1.0
    assert {Sampling(temperature=5.0, top_k=1).pick(logits, [], np.random.default_rng(i)) for i in range(20)} == {1}
    draws = [Sampling(temperature=1.0).pick(logits, [], np.random.default_rng(i)) for i in range(400)]
    assert set(draws) == {0, 1, 2, 3}
    freq = np.bincount(draws, minlength=4) / 400
    np.testing.assert_allclose(freq, np.exp(logits) / np.exp(logits).sum(), atol=0.08)


@pytest.mark.parametrize("kw, msg", [({"temperature": -1}, "temperature must be >= 0"), ({"top_k": -2}, "top_k"),
                                     ({"top_p": 0.0}, "top_p must be in"), ({"top_p": 1.5}, "top_p must be in"),
                                     ({"repetition_penalty": 0}, "repetition_penalty must be > 0")])
def test_bad_settings(kw, msg):
    with pytest.raises(ValueError, match=msg): Sampling(**kw)


@pytest.mark.parametrize("jit", [True, False])
def test_generator_host_sampling(jit):
    model = GPT2(GPT2Config(vocab_size=37, n_positions=24, n_embd=16, n_layer=1, n_head=2))
    gen = Generator(model, jit=jit)
    s = Sampling(temperature=1.0, top_k=10, top_p=0.9, repetition_penalty=1.2, seed=3)
    a, b = gen.generate([1, 2, 3], 8, sampling=s).tokens, gen.generate([1, 2, 3], 8, sampling=s).tokens
    assert a == b and len(a) == 8 and all(0 <= t < 37 for t in a)
    # greedy through the host path (a repetition penalty of 1.0 + 1e-9 forces it) equals the on-device argmax
    greedy = gen.generate([4, 5], 6).tokens
    assert gen.generate([4, 5], 6, sampling=Sampling(repetition_penalty=1.0 + 1e-9)).tokens == greedy
