"""TinyJit's capture state, below the frontend: which captures are in progress in this thread, and what the
frontend and the engine tell them (the kernels run_schedule executes, the writes assign() makes, the relayouts a
realize computes). engine/realize.py and the Tensor mixins record here; engine/jit.py (TinyJit, above the frontend)
reads it.
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from typing import TYPE_CHECKING, Any, Iterator

from fusegrad.device import Buffer

if TYPE_CHECKING:
    from fusegrad.schedule import ScheduleItem


class JitError(Exception):
    """A TinyJit misuse that would otherwise give silently wrong results."""


class _CaptureStack(threading.local):
    """The TinyJit captures in progress in this thread (run_schedule appends the items it executes to the innermost):
    a capture in one thread doesn't see, or forbid, another thread's work."""
    def __init__(self) -> None:
        self.stack: list[list[ScheduleItem]] = []
        self.assigns: list[list[Any]] = []   # weak refs to the tensors assigned to during each capture
        self.relayouts: list[list[tuple[Buffer, Buffer]]] = []   # (source, copy) of the relayouts each capture ran
    def __bool__(self) -> bool: return bool(self.stack)
    def __getitem__(self, i: int) -> list[ScheduleItem]: return self.stack[i]
    def append(self, items: list[ScheduleItem]) -> None:
        self.stack.append(items); self.assigns.append([]); self.relayouts.append([])
    def pop(self) -> list[ScheduleItem]: self.assigns.pop(); self.relayouts.pop(); return self.stack.pop()


capturing = _CaptureStack()


@contextlib.contextmanager
def not_capturing() -> Iterator[None]:
    """Run a block outside this thread's captures: for reading a value that is the same on every call (a shape
    computed from constants); what the block runs is not recorded."""
    saved = capturing.stack, capturing.assigns, capturing.relayouts
    capturing.stack, capturing.assigns, capturing.relayouts = [], [], []
    try: yield
    finally: capturing.stack, capturing.assigns, capturing.relayouts = saved


def note_assign(t: Any) -> None:
    """assign() made a pending write to `t`: a capture realizes it at the end, so replays perform it too."""
    if capturing.stack: capturing.assigns[-1].append(weakref.ref(t))


def note_relayout(src: Buffer, copy: Buffer) -> None:
    """A realize computed `copy`, a relayout (a contiguous copy of movement ops) of the buffer `src`."""
    if capturing.stack: capturing.relayouts[-1].append((src, copy))
