"""The docstring examples of fusegrad.models run and print what they show."""
from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["bert", "decoding", "gpt2", "llama", "loading", "tokenizer"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str):
    module = importlib.import_module(f"fusegrad.models.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {name}"
