"""Run the onnx node tests against fusegrad and rewrite node_expected_failures.txt and the tables in docs/onnx.md.

Usage: python test/onnx/update_node_report.py   (from the repository root; takes a few minutes on one core)
"""

import collections, pathlib, re, sys, unittest, warnings

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import onnx  # noqa: E402
import onnx.backend.test  # noqa: E402
from onnx.backend.test.loader import load_model_tests  # noqa: E402
from fusegrad.onnx.backend import FusegradBackend  # noqa: E402

HERE = pathlib.Path(__file__).parent
DOC = HERE.parents[1] / "docs" / "onnx.md"


def reason(msg: str) -> str:
    last = msg.strip().splitlines()[-1] if msg.strip() else "?"
    m = re.search(r"ONNX op '(\w+)' \(domain ([\w.]+), opset (\d+)\)", last)
    if m:
        return f"unsupported op {m.group(1)} ({m.group(2)} opset {m.group(3)})" + (
            ": " + last.split(": ", 2)[-1] if "is not supported by fusegrad:" in last else ""
        )
    m = re.search(r"numpy dtype (\w+) is not supported", last)
    if m:
        return f"dtype {m.group(1)} not supported"
    if "string tensors" in last:
        return "string tensors not supported"
    if "Mismatched elements" in msg or "Not equal to tolerance" in msg or "DESIRED" in msg:
        return "wrong result"
    return "error: " + last[:100]


def main() -> None:
    warnings.simplefilter("ignore")
    bt = onnx.backend.test.BackendTest(FusegradBackend, __name__)
    cls = bt.test_cases["OnnxBackendNodeModelTest"]
    ops = {f"{t.name}_cpu": sorted({n.op_type for n in t.model.graph.node}) for t in load_model_tests(kind="node")}
    results: dict[str, tuple[str, str]] = {}
    for name in sorted(n for n in dir(cls) if n.startswith("test_") and n.endswith("_cpu")):
        r = unittest.TestResult()
        cls(name).run(r)
        if r.errors or r.failures:
            results[name] = ("fail", reason((r.errors or r.failures)[0][1]))
        elif r.skipped:
            results[name] = ("skip", r.skipped[0][1])
        else:
            results[name] = ("pass", "")
    fails = {n: why for n, (s, why) in results.items() if s == "fail"}
    (HERE / "node_expected_failures.txt").write_text(
        "# onnx node tests fusegrad fails today, with the reason (rewritten by test/onnx/update_node_report.py)\n"
        + "".join(f"{n} {why}\n" for n, why in sorted(fails.items()))
    )
    count = collections.Counter(s for s, _ in results.values())
    per_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for n, (s, _) in results.items():
        key = " + ".join(ops.get(n, ["?"])[:1]) if len(ops.get(n, [])) <= 1 else ops[n][0] + " (model)"
        per_op[key][s] += 1
    total = sum(count.values())
    lines = [
        f"Node tests: **{count['pass']} passed, {count['fail']} failed, {count['skip']} skipped** of {total} "
        f"(onnx {onnx.__version__}, opset {onnx.defs.onnx_opset_version()}): "
        f"**{100 * count['pass'] / total:.1f}%** passing on CPU.",
        "",
        "| op | passed | failed | skipped |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {op} | {c['pass']} | {c['fail']} | {c['skip']} |" for op, c in sorted(per_op.items())]
    by_reason = collections.defaultdict(list)
    for n, why in fails.items():
        by_reason[why].append(n)
    flines = [f"- {why}: {', '.join(sorted(ns))}" for why, ns in sorted(by_reason.items(), key=lambda kv: -len(kv[1]))]
    doc = DOC.read_text()
    doc = re.sub(
        r"(<!-- node-table -->\n).*?(<!-- /node-table -->)",
        lambda m: m.group(1) + "\n".join(lines) + "\n" + m.group(2),
        doc,
        flags=re.S,
    )
    doc = re.sub(
        r"(<!-- node-failures -->\n).*?(<!-- /node-failures -->)",
        lambda m: m.group(1) + "\n".join(flines) + "\n" + m.group(2),
        doc,
        flags=re.S,
    )
    DOC.write_text(doc)
    print(count, f"{100 * count['pass'] / total:.1f}%")


if __name__ == "__main__":
    main()
