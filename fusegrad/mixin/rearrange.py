"""einops-style `rearrange`: a pattern like 'b (h w) c -> b h w c' parsed into one reshape, one permute and one
reshape. Supports groups `(h w)`, the ellipsis `...` (also grouped on the right, `(...)`), unit axes `1` and `()`, and
sizes given as keywords. Bad patterns raise RearrangeError (a ValueError, also a RuntimeError) saying what is wrong.
"""
from __future__ import annotations

import keyword
from typing import TYPE_CHECKING

from fusegrad.helpers import prod

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

_ELLIPSIS = "..."


class RearrangeError(ValueError, RuntimeError):
    """A rearrange pattern that is malformed or doesn't fit the tensor."""


def _parse_side(side: str, what: str) -> list[list[str]]:
    """'b (h w) 1 ...' -> [['b'], ['h', 'w'], [], '...']: the axis names of each axis of that side; a bare '...' stays
    a string (it stands for any number of axes), one in parentheses is a member of that group's list."""
    groups: list[list[str]] = []
    cur: list[str] | None = None
    for tok in side.replace("(", " ( ").replace(")", " ) ").split():
        if tok == "(":
            if cur is not None: raise RearrangeError(f"nested parentheses in the {what} side {side!r}")
            cur = []
        elif tok == ")":
            if cur is None: raise RearrangeError(f"unbalanced ')' in the {what} side {side!r}")
            groups.append(cur)
            cur = None
        else:
            if tok == "1": names: list[str] = []        # an anonymous axis of size 1
            elif tok == _ELLIPSIS:
                if cur is None:
                    groups.append(tok)  # type: ignore[arg-type]   # a bare ellipsis: several axes
                    continue
                names = [tok]
            elif tok.isidentifier() and not keyword.iskeyword(tok): names = [tok]
            elif tok.isdecimal(): raise RearrangeError(f"rearrange takes no anonymous axes other than 1, got {tok!r}")
            else: raise RearrangeError(f"invalid axis name {tok!r} in {side!r}")
            if cur is not None: cur.extend(names)
            else: groups.append(names)
    if cur is not None: raise RearrangeError(f"unbalanced '(' in the {what} side {side!r}")
    flat = [n for g in groups for n in ([g] if g == _ELLIPSIS else g)]
    if flat.count(_ELLIPSIS) > 1: raise RearrangeError(f"'...' appears more than once in {side!r}")
    if len(set(flat)) != len(flat):
        raise RearrangeError(f"axis {next(n for n in flat if flat.count(n) > 1)!r} repeats in the {what} side {side!r}")
    return groups


def _expand_ellipsis(groups: list[list[str]], names: list[str]) -> list[list[str]]:
    """Replace '...' by the axes it stands for: separate axes when alone, one group's members inside parentheses."""
    out: list[list[str]] = []
    for g in groups:
        if g == _ELLIPSIS: out.extend([n] for n in names)
        else: out.append([m for n in g for m in (names if n == _ELLIPSIS else [n])])
    return out


def rearrange(x: "Tensor", formula: str, **sizes: int) -> "Tensor":
    """See `Tensor.rearrange`."""
    if not isinstance(formula, str) or formula.count("->") != 1:
        raise RearrangeError(f"a rearrange pattern has one '->' between its two sides, got {formula!r}")
    lhs_s, rhs_s = formula.split("->")
    lhs, rhs = _parse_side(lhs_s, "left"), _parse_side(rhs_s, "right")
    l_ell = _ELLIPSIS in lhs
    if l_ell != any(g == _ELLIPSIS or _ELLIPSIS in g for g in rhs):
        raise RearrangeError(f"'...' must be on both sides of {formula!r}")
    if any(g != _ELLIPSIS and _ELLIPSIS in g for g in lhs):
        raise RearrangeError(f"'...' can't be inside parentheses on the left side of {formula!r}")
    n_fixed = len(lhs) - l_ell
    if x.ndim < n_fixed or (not l_ell and x.ndim != n_fixed):
        raise RearrangeError(f"the left side of {formula!r} has {n_fixed} axes{' plus ...' if l_ell else ''}, "
                             f"the tensor has {x.ndim} (shape {x.shape})")
    ell = [f"...{i}" for i in range(x.ndim - n_fixed)]
    lhs, rhs = _expand_ellipsis(lhs, ell), _expand_ellipsis(rhs, ell)
    lnames, rnames = [n for g in lhs for n in g], [n for g in rhs for n in g]
    if set(lnames) != set(rnames):
        only = sorted((set(lnames) ^ set(rnames)) - set(ell))
        raise RearrangeError(f"axes {only} appear on only one side of {formula!r}")
    if (extra := sorted(set(sizes) - set(lnames))):
        raise RearrangeError(f"sizes given for axes {extra} not in {formula!r}")
    for k, v in sizes.items():
        if not isinstance(v, int) or v < 0: raise RearrangeError(f"size of {k!r} must be a non-negative int, got {v!r}")
    dims: dict[str, int] = dict(sizes)
    for g, s in zip(lhs, x.shape):
        unknown = [n for n in g if n not in dims]
        known = prod(dims[n] for n in g if n in dims)
        if len(unknown) > 1:
            raise RearrangeError(f"can't infer the sizes of {unknown} in a group of size {s}: give all but one "
                                 "as keywords")
        if unknown:
            if known == 0 or s % known: raise RearrangeError(f"axis of size {s} doesn't split into {g} with {sizes}")
            dims[unknown[0]] = s // known
        elif known != s:
            what = "(" + " ".join(g) + ")" if len(g) != 1 else g[0]
            raise RearrangeError(f"axis {what or '1'} has size {s}, but {formula!r} with {sizes} gives it {known}")
    y = x.reshape(tuple(dims[n] for n in lnames))
    y = y.permute(tuple(lnames.index(n) for n in rnames))
    return y.reshape(tuple(prod(dims[n] for n in g) for g in rhs))
