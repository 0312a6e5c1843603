"""docs/env_vars.md can't drift from the code: its table names exactly the environment variables the package's source
reads, each with exactly the files that read it, and no read hides its name in a variable."""
from __future__ import annotations

import pathlib
import re

from fusegrad.doctor import env_reads, env_vars_read

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "env_vars.md"
# generic readers whose name is a parameter: helpers.getenv and ContextVar themselves, and the doctor listing the
# variables that are set (it loops over env_vars_read()'s names)
DYNAMIC_OK = {"fusegrad/helpers.py": 2, "fusegrad/doctor.py": 2}


def table() -> dict[str, set[str]]:
    """name -> the files in its "read in" cell."""
    rows = {}
    for line in PAGE.read_text().splitlines():
        m = re.match(r"^\| `([A-Z][A-Z0-9_]*)` \|(.*)\|(.*)\|(.*)\|$", line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} has two rows"
            rows[m.group(1)] = set(re.findall(r"`([\w/.]+\.py)`", m.group(4)))
    return rows


def test_the_table_lists_every_variable_the_code_reads():
    code = {name: {loc.rsplit(":", 1)[0] for loc in locs} for name, locs in env_vars_read().items()}
    doc = table()
    assert len(code) > 30 and {"DEBUG", "DEV", "CC", "MNIST_DIR", "DOWNLOAD_TIMEOUT", "LRU"} <= set(code)
    assert not set(code) - set(doc), f"read in the code, missing from docs/env_vars.md: {sorted(set(code) - set(doc))}"
    assert not set(doc) - set(code), f"in docs/env_vars.md but never read: {sorted(set(doc) - set(code))}"
    wrong = {k: (sorted(doc[k]), sorted(code[k])) for k in code if doc[k] != code[k]}
    assert not wrong, f"'read in' cells that differ from the code (page, code): {wrong}"


def test_no_read_hides_its_name():
    """A name built at run time would escape the table; only the generic readers may take one."""
    found = {}
    for path in sorted((ROOT / "fusegrad").rglob("*.py")):
        if (lines := env_reads(path.read_text())[1]): found[path.relative_to(ROOT).as_posix()] = len(lines)
    assert found == DYNAMIC_OK


def test_the_extractor():
    src = '\n'.join([  # noqa: FLY002 - one line of source per row, each with its comment
        'import os, contextvars',
        'from fusegrad.helpers import getenv, ContextVar',
        'A = getenv("ALPHA", 1)',
        'B = os.getenv("BRAVO")',
        'C = ContextVar("CHARLIE", 0)',
        'D = os.environ["DELTA"]',
        'E = os.environ.get("ECHO", "")',
        'F = "FOXTROT" not in os.environ',
        'os.environ["GOLF"] = "1"',                   # a write, not a read
        'H = contextvars.ContextVar("hotel")',         # Python's contextvars: no env var
        'def f(k): return os.getenv(k)',               # a name the code computes
        'def g():',
        '    """getenv("INDIA") in a docstring is no read"""',
        '    return {**os.environ, "JULIET": "1"}',   # building a child's env, not a read
    ])
    names, dynamic = env_reads(src)
    assert [n for n, _ in names] == ["ALPHA", "BRAVO", "CHARLIE", "DELTA", "ECHO", "FOXTROT"]
    assert [line for _, line in names] == [3, 4, 5, 6, 7, 8]
    assert dynamic == [11]
