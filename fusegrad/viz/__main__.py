"""Terminal viewer for saved VIZ data (`VIZ_SAVE=path`), for machines without a browser.

    python -m fusegrad.viz --list [--file PATH]          contexts, kernels and passes
    python -m fusegrad.viz --kernel NAME [--file PATH]   a kernel's source, linear program, AST and passes
    python -m fusegrad.viz --pass NAME [--file PATH]     a pass: rules fired (file:line), graph before/after
    python -m fusegrad.viz --serve [--file PATH]         the web page for the file

NAME matches by substring (or `#id`). PATH defaults to $VIZ_SAVE, then the file a non-interactive VIZ=1 run saves.
"""
from __future__ import annotations

import argparse
import atexit
import os
import sys
from typing import Any

from fusegrad.viz import at_exit, default_save_path, serve
from fusegrad.viz.serialize import load

Marks = set[int] | frozenset[int]


def graph_tree(nodes: list[list[Any]], root: int, mark: Marks = frozenset(), max_lines: int = 200) -> list[str]:
    """The graph under `root` as an indented tree, users above their sources; a node seen before is printed as
    `^%id`. Nodes in `mark` get a `*`."""
    lines: list[str] = []
    seen: set[int] = set()
    stack: list[tuple[int, int]] = [(root, 0)]
    while stack and len(lines) < max_lines:
        nid, depth = stack.pop()
        op, dtype, arg, srcs = nodes[nid]
        star = "*" if nid in mark else " "
        if nid in seen:
            lines.append(f"{star}{'  ' * depth}^%{nid} {op}")
            continue
        seen.add(nid)
        lines.append(f"{star}{'  ' * depth}%{nid} {op} {dtype}{' ' + arg if arg else ''}")
        stack.extend((s, depth + 1) for s in reversed(srcs))
    if stack: lines.append(f"... (cut at {max_lines} lines: --max-lines)")
    return lines


def graph_list(nodes: list[list[Any]], root: int, mark: Marks = frozenset(), max_lines: int = 200) -> list[str]:
    """The graph under `root` as a node list, sources first (the DEBUG=5 layout)."""
    keep: set[int] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if n in keep: continue
        keep.add(n)
        stack.extend(nodes[n][3])
    out = [f"{'*' if i in mark else ' '}%{i:<5} {nodes[i][0]:<12} {nodes[i][1]:<16} "
           f"[{', '.join(f'%{s}' for s in nodes[i][3])}] {nodes[i][2]}" for i in sorted(keep)]
    return out if len(out) <= max_lines else out[:max_lines] + [f"... ({len(out) - max_lines} more: --max-lines)"]


def _select(items: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    if name.startswith("#") and name[1:].isdigit(): return [i for i in items if i["id"] == int(name[1:])]
    exact = [i for i in items if i["name"] == name]
    return exact or [i for i in items if name.lower() in i["name"].lower()]


def _runs(pids: list[int], passes: list[dict[str, Any]], fold: bool) -> list[list[int]]:
    """Consecutive passes of one name, as runs; runs shorter than 4 (all runs, without `fold`) become single passes."""
    runs: list[list[int]] = []
    for p in pids:
        if runs and passes[runs[-1][-1]]["name"] == passes[p]["name"]: runs[-1].append(p)
        else: runs.append([p])
    out: list[list[int]] = []
    for r in runs:
        if fold and len(r) >= 4: out.append(r)
        else: out.extend([p] for p in r)
    return out


def cmd_list(data: dict[str, Any], out: list[str], fold: bool = True) -> None:
    idx = data["index"]
    ctxs = {c["id"]: c for c in idx["contexts"]}
    out.append(f"{len(idx['contexts']) - 1} contexts, {len(idx['kernels'])} kernels, {len(idx['passes'])} passes, "
               f"{idx['n_events']} timeline events (recorded by: {' '.join(idx.get('argv', []))})")

    def show(c: dict[str, Any], depth: int) -> None:
        dur = f"  {c['dur'] / 1e3:.2f} ms" if c.get("dur") else ""
        kern = f"  kernel #{c['kernel']}" if c["kernel"] is not None else ""
        if c["kind"] != "program" or c["passes"]:
            out.append(f"{'  ' * depth}[{c['kind']}] {c['name']}{kern}{dur}")
        for run in _runs(c["passes"], idx["passes"], fold):
            s, pad = idx["passes"][run[0]], "  " * (depth + 1)
            if len(run) == 1:
                out.append(f"{pad}pass #{run[0]} {s['name']!r}: {s['n_before']} -> {s['n_after']} nodes, "
                           f"{s['n_rules']} rewrites")
            else:
                fired = sum(1 for p in run if idx["passes"][p]["n_rules"])
                out.append(f"{pad}passes #{run[0]}..#{run[-1]} {s['name']!r} x{len(run)}, {fired} with rewrites "
                           "(--all lists them)")
        for ch in c["children"]: show(ctxs[ch], depth + 1)
    show(ctxs[0], -1 if not ctxs[0]["passes"] else 0)


def cmd_kernel(data: dict[str, Any], name: str, out: list[str], fmt: str, max_lines: int) -> None:
    found = _select(data["index"]["kernels"], name)
    if not found: raise SystemExit(f"no kernel matches {name!r}; `--list` shows them")
    for s in found:
        k = data["kernels"][s["id"]]
        out += [f"=== kernel #{k['id']} {k['name']} on {k['device']} ({k['renderer']})"
                f"{'  opts: ' + k['opts'] if k['opts'] else ''}", "--- source", k["src"].rstrip(),
                f"--- linear program ({k['n_linear']} ops)", k["linear"], "--- kernel AST"]
        out += (graph_tree if fmt == "tree" else graph_list)(k["ast"]["nodes"], k["ast"]["root"], set(), max_lines)
        ctx = data["index"]["contexts"][k["ctx"]]
        for p in ctx["passes"]: _rules(data["passes"][p], out)


def _rules(p: dict[str, Any], out: list[str]) -> None:
    out.append(f"--- pass #{p['id']} {p['name']!r}: {p['n_before']} -> {p['n_after']} nodes, rules fired:")
    out += [f"  {r['count']:5d}x {r['loc']}" for r in p["rules"]] or ["  (none)"]


def cmd_pass(data: dict[str, Any], name: str, out: list[str], fmt: str, max_lines: int) -> None:
    found = _select(data["index"]["passes"], name)
    if not found: raise SystemExit(f"no pass matches {name!r}; `--list` shows them")
    for s in found:
        p = data["passes"][s["id"]]
        ctx = data["index"]["contexts"][p["ctx"]]
        out.append(f"=== pass #{p['id']} {p['name']!r} in {ctx['name']}")
        _rules(p, out)
        show = graph_tree if fmt == "tree" else graph_list
        out.append(f"--- before ({p['n_before']} nodes; * = gone after the pass)")
        out += show(p["nodes"], p["before"], set(p["removed"]), max_lines)
        out.append(f"--- after ({p['n_after']} nodes; * = new: rebuilt, or made by the rule named after <-)")
        made = p["made_by"]
        for ln in show(p["nodes"], p["after"], set(p["added"]), max_lines):
            nid = ln[1:].split()[0].lstrip("%^") if ln.startswith("*") else ""
            out.append(ln + (f"    <- {made[nid]}" if nid in made and "^" not in ln else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fusegrad.viz", description=__doc__.split("\n")[0])
    ap.add_argument("--file", default=None, help="saved VIZ data (default: $VIZ_SAVE, else the temp-dir default)")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--list", action="store_true", help="contexts, kernels and passes")
    g.add_argument("--kernel", metavar="NAME", help="show kernels whose name contains NAME (or #id)")
    g.add_argument("--pass", dest="pass_", metavar="NAME", help="show passes whose name contains NAME (or #id)")
    g.add_argument("--serve", action="store_true", help="serve the web page for the file (VIZ_PORT, default 8000)")
    ap.add_argument("--all", action="store_true", help="--list: every pass, not runs of one name folded")
    ap.add_argument("--graph", choices=("tree", "list"), default="tree", help="graph layout (default: tree)")
    ap.add_argument("--max-lines", type=int, default=200, help="per graph (default 200)")
    a = ap.parse_args(argv)
    atexit.unregister(at_exit)  # with VIZ=1 still exported, the viewer must not save (or serve) its own empty run
    path = a.file or os.getenv("VIZ_SAVE") or default_save_path()
    if not os.path.exists(path): raise SystemExit(f"no VIZ data at {path}: run with VIZ=1 VIZ_SAVE={path} first")
    data = load(path)
    if a.serve:
        serve(data)
        return 0
    out: list[str] = []
    if a.list: cmd_list(data, out, fold=not a.all)
    elif a.kernel is not None: cmd_kernel(data, a.kernel, out, a.graph, a.max_lines)
    else: cmd_pass(data, a.pass_, out, a.graph, a.max_lines)
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
