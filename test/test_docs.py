"""The Tensor API pages (docs/tensor/*.md) print what they say they print.

Each page's ```python blocks run in order in one namespace, in a fresh interpreter per page (so a page's manual_seed,
default dtypes or training flag can't leak into another). A block followed by a ```text block (after an optional `Output:`
line) must print exactly that text (trailing whitespace ignored); a block without one must print nothing. A block whose
preceding line is `<!-- no-test -->` is skipped (only for code that needs data or a network).

The outputs on the pages are produced by running them, never typed by hand:

    python test/test_docs.py --update docs/tensor/creation.md    # rewrite that page's Output blocks
    python test/test_docs.py --update                            # every page

docs/quickstart.md is checked by test/test_examples.py (its DEBUG timing lines need a looser comparison).
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import pathlib
import subprocess
import sys
import traceback

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs" / "tensor").glob("*.md"))
NO_TEST = "<!-- no-test -->"


@dataclasses.dataclass
class Block:
    source: str
    line: int                         # 1-based line of the ```python fence
    expected: str | None              # the text block's contents, None when the block has no output block
    out_span: tuple[int, int] | None  # [start, end) line indices (0-based) of the output: `Output:` (if any) .. fence
    end: int                          # 0-based index of the line after the python block's closing fence
    skip: bool


def _next_nonblank(lines: list[str], k: int) -> int:
    while k < len(lines) and not lines[k].strip(): k += 1
    return k


def parse(text: str) -> list[Block]:
    """The ```python blocks of a page, each with the ```text block that follows it (after blank lines and an optional
    `Output:` line)."""
    lines = text.split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```python":
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```": j += 1
        if j == len(lines): raise ValueError(f"unclosed ```python block at line {start + 1}")
        source = "\n".join(lines[start + 1:j]) + "\n"
        prev = next((lines[k].strip() for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        k = _next_nonblank(lines, j + 1)
        o = _next_nonblank(lines, k + 1) if k < len(lines) and lines[k].strip() == "Output:" else k
        expected, span = None, None
        if o < len(lines) and lines[o].strip() == "```text":
            e = o + 1
            while e < len(lines) and lines[e].strip() != "```": e += 1
            expected, span = "\n".join(lines[o + 1:e]) + "\n", (k, e + 1)
        elif o != k:
            raise ValueError(f"'Output:' at line {k + 1} must be followed by a ```text block")
        blocks.append(Block(source, start + 1, expected, span, j + 1, prev == NO_TEST))
        i = j + 1
    return blocks


def normalize(text: str) -> str:
    return "\n".join(ln.rstrip() for ln in text.strip("\n").splitlines())


def run_page(path: pathlib.Path) -> list[str | None]:
    """Run the page's blocks in order in one namespace; the stdout of each (None for skipped blocks).
    An exception stops the page: the traceback becomes that block's output."""
    namespace: dict = {"__name__": f"docs_{path.stem}"}
    outs: list[str | None] = []
    for b in parse(path.read_text()):
        if b.skip:
            outs.append(None)
            continue
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                exec(compile(b.source, f"{path.name}:{b.line}", "exec"), namespace)  # noqa: S102 - the page is ours
        except Exception:  # noqa: BLE001 - reported as the block's output
            outs.append(buf.getvalue() + "EXCEPTION\n" + traceback.format_exc())
            break
        outs.append(buf.getvalue())
    return outs


def run_page_isolated(path: pathlib.Path) -> list[str | None]:
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "DEV", "DEFAULT_FLOAT", "DEFAULT_INT")}
    env["DEV"] = "CPU"
    r = subprocess.run([sys.executable, __file__, "--json", str(path)], capture_output=True, text=True, env=env,
                       timeout=300, cwd=ROOT, check=False)
    if r.returncode != 0: raise RuntimeError(f"running {path.name} failed:\n{r.stdout}\n{r.stderr}")
    return json.loads(r.stdout.splitlines()[-1])


def update_page(path: pathlib.Path) -> int:
    """Rewrite the page's Output blocks from a run; returns the number of blocks run."""
    text = path.read_text()
    blocks, outs = parse(text), run_page_isolated(path)
    lines = text.split("\n")
    # edit from the bottom up so earlier line numbers stay valid
    for b, out in reversed(list(zip(blocks, outs))):
        if out is None: continue
        if "EXCEPTION\n" in out: raise RuntimeError(f"{path.name}:{b.line} raised:\n{out}")
        body = ["```text", *normalize(out).split("\n"), "```"]
        if b.out_span is None:
            if out.strip(): lines[b.end:b.end] = ["", "Output:", "", *body]
        elif not out.strip():
            lines[b.end:b.out_span[1]] = []
        else:  # keep the page's style (with or without an `Output:` line): replace just the text block
            fence = max(i for i in range(b.out_span[0], b.out_span[1]) if lines[i].strip() == "```text")
            lines[fence:b.out_span[1]] = body
    missing = len(blocks) - len(outs)
    if missing: raise RuntimeError(f"{path.name}: {missing} blocks did not run")
    path.write_text("\n".join(lines))
    return len(outs)


def cpu_available() -> bool:
    from fusegrad.device import Device
    try:
        Device["CPU"]
        return True
    except Exception:  # noqa: BLE001
        return False


def test_pages_exist():
    names = {p.name for p in PAGES}
    assert {"index.md", "creation.md", "movement.md", "indexing.md", "elementwise.md", "reduce.md", "nn_ops.md",
            "dtypes.md", "autograd.md"} <= names, names


def test_parse_finds_outputs():
    page = "x\n\n```python\nprint(1)\n```\n\nOutput:\n\n```text\n1\n```\n\n<!-- no-test -->\n```python\nf()\n```\n" \
           "```python\nprint(2)\n```\n```text\n2\n```\n"
    a, b, c = parse(page)
    assert (a.expected, a.skip, b.expected, b.skip, c.expected) == ("1\n", False, None, True, "2\n")


@pytest.mark.parametrize("path", PAGES, ids=[p.stem for p in PAGES])
def test_page_prints_what_it_says(path: pathlib.Path):
    if not cpu_available(): pytest.skip("the pages' outputs were made on the CPU backend, which needs a C compiler")
    blocks = parse(path.read_text())
    assert blocks, f"{path.name} has no python blocks"
    outs = run_page_isolated(path)
    assert len(outs) == len(blocks), f"{path.name}: only {len(outs)} of {len(blocks)} blocks ran:\n{outs[-1]}"
    for b, out in zip(blocks, outs):
        if out is None: continue
        assert "EXCEPTION\n" not in out, f"{path.name}:{b.line} raised:\n{out}"
        want = normalize(b.expected or "")
        assert normalize(out) == want, f"{path.name}:{b.line} printed\n{out}\nbut the page says\n{want}\n" \
                                       f"(regenerate with: python test/test_docs.py --update {path.relative_to(ROOT)})"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--json"]:
        print(json.dumps(run_page(pathlib.Path(sys.argv[2]))))
    elif sys.argv[1:2] == ["--update"]:
        for p in ([pathlib.Path(a).resolve() for a in sys.argv[2:]] or PAGES):
            print(f"{p.name}: {update_page(p)} blocks")
    else:
        sys.exit("usage: python test/test_docs.py --update [page.md ...]")
