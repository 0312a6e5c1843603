"""Reading GCC's x86 assembly in tests: the innermost loop of a kernel function that does vector float math (its
reduce loop), for the register-tile and narrow-vector tests."""
from __future__ import annotations

import re

LABEL = re.compile(r"^(\.L\w+):")
JUMP = re.compile(r"^\s+j\w+\s+(\.L\w+)")
VEC_MATH = re.compile(r"^\s+v(fmadd|fnmadd|mulp|addp)\w*\s")


def hot_loop(asm: str, fn: str) -> list[str]:
    """The innermost loop of function `fn` that does vector arithmetic: of the spans from a label to a jump back to it
    (a loop), the shortest that holds an FMA (or a vector multiply/add)."""
    lines = asm.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln == f"{fn}:")
    end = next(i for i in range(start, len(lines)) if lines[i].strip().startswith(".cfi_endproc"))
    body = lines[start:end]
    labels: dict[str, int] = {}
    loops = []
    for i, ln in enumerate(body):
        if (m := LABEL.match(ln)): labels[m.group(1)] = i
        elif (m := JUMP.match(ln)) and m.group(1) in labels: loops.append(body[labels[m.group(1)]:i + 1])
    hot = [lp for lp in loops if any(VEC_MATH.match(ln) for ln in lp)]
    assert hot, f"no loop with vector arithmetic in {fn}"
    return min(hot, key=len)
