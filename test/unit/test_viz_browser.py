"""The VIZ page in a real browser: Debian's chromium, headless, driven over the DevTools protocol.

The protocol runs on a pipe (`--remote-debugging-pipe`: JSON messages ended by a NUL byte, the browser reads fd 3 and
writes fd 4), so the test needs nothing but the standard library and `apt-get install chromium`. It records a small
training step with VIZ=1, serves it, clicks into a kernel, a pass and the timeline, checks what rendered (DOM, no JS
errors) and saves screenshots to $FUSEGRAD_ARTIFACTS (default /tmp/fusegrad-artifacts).
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import pytest

from fusegrad.ir.ops import Ops
from test_viz import TRAIN  # the Linear + SGD step that test_viz.py records too

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")



class Browser:
    """Headless chromium with a DevTools-protocol session on one page."""

    def __init__(self, exe: str, profile_dir: str):
        to_rd, to_wr = os.pipe()      # we write to_wr, the browser reads fd 3
        from_rd, from_wr = os.pipe()  # the browser writes fd 4, we read from_rd
        hi = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_rd, from_wr)]  # clear of 3 and 4
        for fd in (to_rd, from_wr): os.close(fd)
        to_rd, from_wr = hi
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions",
                 "--no-first-run", "--no-default-browser-check", "--metrics-recording-only", "--mute-audio",
                 "--disable-dev-shm-usage", "--window-size=1400,900", f"--user-data-dir={profile_dir}",
                 "--remote-debugging-pipe", "about:blank"]
        # a small Python trampoline puts the pipe ends on fds 3 and 4 and then becomes the browser
        tramp = (f"import os, sys; os.dup2({to_rd}, 3); os.dup2({from_wr}, 4); os.close({to_rd}); "
                 f"os.close({from_wr}); os.execv(sys.argv[1], sys.argv[1:])")
        self.proc = subprocess.Popen([sys.executable, "-c", tramp, exe, *flags], pass_fds=(to_rd, from_wr),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in (to_rd, from_wr): os.close(fd)
        self.wr, self.rd = to_wr, from_rd
        self.next_id, self.replies, self.events = 0, queue.Queue(), []  # type: ignore[var-annotated]
        self.pending: dict[int, Any] = {}
        threading.Thread(target=self._reader, daemon=True).start()
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for m in ("Page.enable", "Runtime.enable"): self.call(m, session=True)

    def _reader(self) -> None:
        buf = b""
        while True:
            chunk = os.read(self.rd, 1 << 16)
            if not chunk: break
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg: self.replies.put(msg)
                else: self.events.append(msg)

    def call(self, method: str, session: bool = False, timeout: float = 30, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session: msg["sessionId"] = self.session
        os.write(self.wr, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            reply = self.replies.get(timeout=max(deadline - time.time(), 0.01))
            if reply["id"] == self.next_id: break
        if "error" in reply: raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def js(self, expr: str) -> Any:
        r = self.call("Runtime.evaluate", session=True, expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r: raise RuntimeError(f"JS error in {expr!r}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expr: str, timeout: float = 15) -> Any:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if v := self.js(expr): return v
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {expr}")

    def click(self, selector: str) -> None:
        """A real mouse click at the middle of the element (scrolled into view first)."""
        box = self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
                      "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
                      "return [r.left + Math.min(r.width / 2, 40), r.top + r.height / 2]; })()")
        assert box is not None, f"no element {selector}"
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", session=True, type=kind, x=box[0], y=box[1], button="left",
                      clickCount=1)

    def wheel(self, selector: str, delta: float) -> None:
        box = self.js(f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                      "return [r.left + r.width * 0.6, r.top + r.height / 2]; })()")
        self.call("Input.dispatchMouseEvent", session=True, type="mouseWheel", x=box[0], y=box[1], deltaX=0,
                  deltaY=delta)

    def screenshot(self, path: str) -> None:
        data = self.call("Page.captureScreenshot", session=True, format="png")["data"]
        with open(path, "wb") as f: f.write(base64.b64decode(data))

    def js_errors(self) -> list[str]:
        errs = [str(e["params"]["exceptionDetails"]) for e in self.events
                if e.get("method") == "Runtime.exceptionThrown"]
        errs += [str(e["params"]["args"]) for e in self.events
                 if e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert")]
        return errs + (self.js("window.__vizErrors || []") or [])

    def close(self) -> None:
        try: self.call("Browser.close", timeout=5)
        except Exception: pass
        try: self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.wr)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from fusegrad.viz import load
    from fusegrad.viz.server import serve_in_thread, url
    path = str(tmp_path_factory.mktemp("viz") / "train.json")
    env = {**os.environ, "VIZ": "1", "VIZ_NO_SERVE": "1", "VIZ_SAVE": path}
    subprocess.run([sys.executable, "-c", TRAIN], env=env, check=True, capture_output=True, timeout=120)
    srv = serve_in_thread(load(path))
    yield url(srv)
    srv.shutdown()
    srv.server_close()


ART = os.getenv("FUSEGRAD_ARTIFACTS") or os.path.join(tempfile.gettempdir(), "fusegrad-artifacts")


@pytest.fixture(scope="module")
def browser() -> Any:
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory() as profile:
        b = Browser(CHROMIUM, profile)
        try:
            yield b
        finally:
            b.close()


def test_page_in_headless_chromium(served: str, browser: Browser) -> None:
    art, b = ART, browser
    os.makedirs(art, exist_ok=True)
    b.call("Page.navigate", session=True, url=served)
    b.wait_for("!!document.body && document.body.dataset.ready === '1'")
    # the step's realize (backward and the update) and loss.item()'s (the Linear's initialization is lazy: it runs
    # inside the step, not in a realize of its own)
    assert b.js("document.querySelectorAll('details.kind-realize').length") >= 2
    # the realize that ran the backward pass and the update: open it, then a kernel with a reduce in it
    b.click("details.kind-realize:nth-last-of-type(2) > summary")
    b.wait_for("!!document.querySelector('details.kind-kernel > summary')")
    b.click("details.kind-kernel > summary")
    src = b.wait_for("document.querySelector('#source') && document.querySelector('#source').textContent")
    assert "void " in src and b.js("document.querySelectorAll('#source .tok-kw, #source .tok-ty').length") > 3
    name = b.js("document.querySelector('#main h2').textContent")
    assert name.startswith("kernel ") and name.split()[1] in src  # the C function is named after the kernel
    assert "STORE" in b.js("document.querySelector('#linear').textContent")
    assert b.js("document.querySelectorAll('#graph-ast g.node').length") > 5
    b.screenshot(os.path.join(art, "viz_kernel.png"))
    # a pass in which a rule fired: before/after graphs with the changed nodes marked, the rule's file:line
    b.js("document.querySelectorAll('details').forEach((d) => d.open = true)")
    b.wait_for("document.querySelectorAll('.item.pass').length > 0")
    pid = b.js("[...document.querySelectorAll('.item.pass')].map((e) => +e.dataset.id)"
               ".find((i) => INDEX.passes[i].n_rules > 0 && INDEX.passes[i].name === 'kernel symbolic')")
    assert pid is not None
    b.click(f".item.pass[data-id='{pid}']")
    b.wait_for("!!document.querySelector('#graph-after g.node')")
    assert b.js("document.querySelector('#main h2').textContent") == 'pass "kernel symbolic"'
    rules = b.js("[...document.querySelectorAll('table.rules td:first-child')].map((e) => e.textContent)")
    assert rules and all(r.startswith("ir/") and r.rsplit(":", 1)[1].isdigit() for r in rules), rules
    assert b.js("document.querySelectorAll('#graph-before g.node').length") > 3
    assert b.js("document.querySelectorAll('#graph-after g.node.made').length") >= 1
    b.click("table.rules tr")
    assert b.js("document.querySelectorAll('#graph-after g.node.sel').length") >= 1
    b.screenshot(os.path.join(art, "viz_pass.png"))
    # the timeline: kernels, copies/compiles per device; the wheel zooms in (tick labels change)
    b.click("#open-timeline")
    b.wait_for("document.querySelectorAll('#timeline rect.ev').length > 0")
    cats = set(b.js("[...document.querySelectorAll('#timeline rect.ev')].map((e) => e.dataset.cat)"))
    assert {"kernel", "compile", "schedule"} <= cats, cats
    ticks = b.js("[...document.querySelectorAll('#timeline .ticklabel')].map((e) => e.textContent).join()")
    for _ in range(3): b.wheel("#timeline svg", -300)
    b.wait_for(f"[...document.querySelectorAll('#timeline .ticklabel')].map((e) => e.textContent).join()"
               f" !== {json.dumps(ticks)}")
    b.screenshot(os.path.join(art, "viz_timeline.png"))
    assert b.js_errors() == []
    for f in ("viz_kernel.png", "viz_pass.png", "viz_timeline.png"):
        with open(os.path.join(art, f), "rb") as fh: assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_big_graph_stays_responsive(browser: Browser) -> None:
    """A 10k-node pass: only the changed neighbourhood is drawn, "show more" adds to it, and nothing hangs."""
    from fusegrad.dtype import dtypes
    from fusegrad.ir.ops import UOp
    from fusegrad.ir.pattern import RewriteTrace
    from fusegrad.viz.recorder import Recorder
    from fusegrad.viz.serialize import build_data
    from fusegrad.viz.server import serve_in_thread, url

    def chain(n: int, odd: int) -> UOp:
        x = UOp.range(10, 0)
        for i in range(n): x = x + UOp.const(dtypes.int32, odd if i == n // 2 else i % 5)
        return x
    before, after = chain(10000, 1), chain(10000, 2)
    changed = next(u for u in after.toposort() if u.op is Ops.ADD and u.src[1].arg == 2)
    rec = Recorder()
    rec.contexts[0].passes.append(RewriteTrace("big pass", before, after, [(("ir/symbolic.py", 1), changed, changed)]))
    srv = serve_in_thread(build_data(rec))
    try:
        b = browser
        b.call("Page.navigate", session=True, url=url(srv))
        b.wait_for("!!document.body && document.body.dataset.ready === '1'")
        st = time.perf_counter()
        b.click(".item.pass[data-id='0']")
        b.wait_for("!!document.querySelector('#graph-after g.node')")
        assert time.perf_counter() - st < 10
        shown = b.js("document.querySelectorAll('#graph-after g.node').length")
        bar = b.js("document.querySelector('#graph-after .bar').textContent")
        assert 0 < shown <= 300 and f"{len(after.toposort())} nodes" in bar
        assert b.js("document.querySelectorAll('#graph-after g.node.made').length") == 1
        b.click("#graph-after button.more")
        b.wait_for("document.querySelectorAll('#graph-after g.node').length > 300")
        b.screenshot(os.path.join(ART, "viz_big_graph.png"))
        assert b.js_errors() == []
    finally:
        srv.shutdown()
        srv.server_close()
