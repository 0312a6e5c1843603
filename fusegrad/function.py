"""Frontend: `function`, tinygrad's graph-level function decorator.

`@function` wraps a Python function of tensors. Each call runs the Python body (as tinygrad does: its body is traced on
every call) and hands back the result's lazy graph, after three checks and options:

- Explicit inputs are the tensors reachable from the arguments (`args`, `kwargs`, and the attributes of objects among
  them, `self` included, as `nn.state.get_state_dict` walks them). A realized buffer the result reads that is none of
  them and was not made during the call (a tensor the body captured from a closure or a global) is an *implicit* input:
  with `allow_implicit=False` (tinygrad's default) that raises `RuntimeError` naming it.
- `grad_fxn(*grad_outputs, call)` replaces the gradient of the body: it gets one gradient per output and a
  `FunctionCall` (`call.src[1:]` are the explicit inputs' nodes, as in tinygrad; `call.inputs` the tensors) and returns
  one gradient per explicit input (a Tensor, a node or None).
- `precompile=True` materializes the outputs (they become kernels of their own, computed once, instead of being fused
  into every consumer); `precompile_backward=True` does the same for the gradients sent to the inputs.

A graph that has the same structure on every call (same shapes, dtypes and ops) is scheduled once and reused: the
schedule cache (schedule/cache.py) keys schedules by graph structure, not by buffers, so that reuse needs no CALL node.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Generic, TypeVar

from fusegrad.autograd import GradFn
from fusegrad.dtype import dtypes
from fusegrad.ir.ops import Ops, UOp
from fusegrad.nn.state import get_state_dict
from fusegrad.device import Buffer, Device
from fusegrad.storage import buffer_uop
from fusegrad.tensor import Tensor, wrap_node

ReturnType = TypeVar("ReturnType")


class FunctionCall:
    """What a `grad_fxn` gets about the call: `src[1:]` the explicit inputs' nodes (tinygrad's `call.src[1:]`), `src[0]`
    the first output's node; `inputs` and `outputs` the tensors; `name` the function's qualified name."""
    def __init__(self, name: str, inputs: tuple[Tensor, ...], outputs: tuple[Tensor, ...]):
        self.name, self.inputs, self.outputs = name, inputs, outputs
        self.src: tuple[UOp, ...] = (outputs[0].uop, *(t.uop for t in inputs))

    def __repr__(self) -> str:
        return f"FunctionCall({self.name}, {len(self.inputs)} inputs, {len(self.outputs)} outputs)"


def _buffer_watermark() -> int:
    """An id below every BUFFER node made from now on (BUFFER ids count up): a BUFFER node of a never-allocated empty
    buffer costs no memory."""
    return buffer_uop(Buffer(Device.DEFAULT, 0, dtypes.uint8)).arg[0]


def _as_node(g: Any, like: Tensor) -> UOp | None:
    """A gradient returned by a grad_fxn as a node of `like`'s shape, dtype and device (None stays None)."""
    if g is None: return None
    t = g if isinstance(g, Tensor) else Tensor(g) if isinstance(g, UOp) else None
    if t is None: raise TypeError(f"grad_fxn returned a {type(g).__name__}; give a Tensor, a UOp or None per input")
    if t.shape != like.shape:
        raise RuntimeError(f"grad_fxn returned a gradient of shape {t.shape} for an input of shape {like.shape}")
    if t.dtype != like.dtype: t = t.cast(like.dtype)
    return t.uop


class _function(Generic[ReturnType]):
    def __init__(self, fxn: Callable[..., ReturnType], *, precompile: bool, precompile_backward: bool,
                 allow_implicit: bool, grad_fxn: Callable | None):
        self.fxn, self.precompile, self.precompile_backward = fxn, precompile, precompile_backward
        self.allow_implicit, self.grad_fxn = allow_implicit, grad_fxn
        functools.update_wrapper(self, fxn)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return functools.partial(self.__call__, obj) if obj is not None else self

    @property
    def name(self) -> str: return getattr(self.fxn, "__qualname__", None) or type(self.fxn).__qualname__

    def __call__(self, *args: Any, **kwargs: Any) -> ReturnType:
        inputs = tuple({id(t): t for t in get_state_dict((args, kwargs)).values()}.values())
        in_nodes = {t.uop for t in inputs}
        # buffers that existed before the call: only these can be implicit inputs (a tensor made in the body isn't)
        before = None if self.allow_implicit else _buffer_watermark()
        ret = self.fxn(*args, **kwargs)
        outs = ret if isinstance(ret, tuple) else (ret,)
        if not outs or not all(isinstance(o, Tensor) for o in outs):
            raise RuntimeError(f"function {self.name} must return a Tensor or a tuple of Tensors, got "
                               f"{type(ret).__name__}")
        if before is not None: self._check_implicit(outs, in_nodes, before)
        if self.grad_fxn is not None: outs = self._with_grad_fxn(inputs, outs)
        elif self.precompile_backward: outs = self._with_materialized_backward(inputs, outs)
        if self.precompile: outs = tuple(o.contiguous() for o in outs)
        return outs if isinstance(ret, tuple) else outs[0]  # type: ignore[return-value]

    def _check_implicit(self, outs: tuple[Tensor, ...], in_nodes: set[UOp], before: int) -> None:
        found: dict[int, UOp] = {}
        for o in outs:
            for n in o.uop.toposort(gate=lambda n: n not in in_nodes):
                if n.op is Ops.BUFFER and n not in in_nodes and n.arg[0] < before: found[n.arg[0]] = n
        if found:
            lines = "\n  ".join(f"{i}: dtype={b.dtype}, size={b.arg[1]}, device={b.src[0].arg}"
                                for i, b in enumerate(found.values()))
            raise RuntimeError(f"function {self.name} has {len(found)} implicit buffer(s), but allow_implicit=False "
                               f"(pass them as arguments, or use @function(allow_implicit=True))\n  {lines}")

    def _with_grad_fxn(self, inputs: tuple[Tensor, ...], outs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        call = FunctionCall(self.name, inputs, outs)
        grad_fxn, n_out, bw_materialize = self.grad_fxn, len(outs), self.precompile_backward
        assert grad_fxn is not None

        def make(i: int) -> Callable:
            def bw(ctx: UOp, node: UOp) -> tuple[UOp | None, ...]:
                # each output gets its own backward; the others' gradients are zero there (a gradient is linear in
                # the output gradients, so the sum over outputs is grad_fxn of all of them)
                grads = [Tensor(ctx) if j == i else outs[j].zeros_like() for j in range(n_out)]
                res = grad_fxn(*grads, call)
                if not isinstance(res, (tuple, list)): res = (res,)
                if len(res) != len(inputs):
                    raise RuntimeError(f"grad_fxn of {self.name} returned {len(res)} gradient(s) for {len(inputs)} "
                                       "input(s)")
                nodes = [_as_node(g, t) for g, t in zip(res, inputs)]
                if bw_materialize: nodes = [None if g is None else Tensor(g).contiguous().uop for g in nodes]
                return tuple(nodes)
            return bw
        return tuple(self._custom(o, inputs, make(i), f"{self.name}.{i}") for i, o in enumerate(outs))

    def _with_materialized_backward(self, inputs: tuple[Tensor, ...], outs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        def make(o: Tensor) -> Callable:
            def bw(ctx: UOp, node: UOp) -> tuple[UOp | None, ...]:
                # (unset inputs too: backward fills their .grad, as tinygrad's does)
                need = [t for t in inputs if t.requires_grad is not False and dtypes.is_float(t.dtype)]
                gs = dict(zip(map(id, need), o.gradient(*need, gradient=Tensor(ctx)))) if need else {}
                return tuple(gs[id(t)].contiguous().uop if id(t) in gs else None for t in inputs)
            return bw
        return tuple(self._custom(o, inputs, make(o), f"{self.name}.{i}") for i, o in enumerate(outs))

    @staticmethod
    def _custom(out: Tensor, inputs: tuple[Tensor, ...], bw: Callable, name: str) -> Tensor:
        """`out`'s value going forward; `bw(grad, node)` gives the inputs' gradients going backward."""
        node = UOp(Ops.DETACH, out.dtype, (out.uop, *(t.uop for t in inputs)), GradFn(bw, name))
        return wrap_node(node, *inputs)


def function(fxn: Callable | None = None, *, precompile: bool = False, precompile_backward: bool = False,
             allow_implicit: bool = False, grad_fxn: Callable | None = None) -> Any:
    """Decorate a function of tensors (also a method): `@function` or `@function(precompile=True, ...)`.

    >>> @function
    ... def f(x, y): return x * y + 1
    >>> f(Tensor([1.0, 2.0]), Tensor([3.0, 4.0])).tolist()
    [4.0, 9.0]
    """
    def wrap(f: Callable) -> _function:
        return _function(f, precompile=precompile, precompile_backward=precompile_backward,
                         allow_implicit=allow_implicit, grad_fxn=grad_fxn)
    return wrap if fxn is None else wrap(fxn)


__all__ = ["function", "FunctionCall"]
