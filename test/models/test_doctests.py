"""The docstring examples of every fusegrad.models module run and print what they show (docs/models.md's blocks are
run by test_models_page.py)."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import fusegrad.models

MODULES = sorted(m.name for m in pkgutil.iter_modules(fusegrad.models.__path__))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(f"fusegrad.models.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {name}"
