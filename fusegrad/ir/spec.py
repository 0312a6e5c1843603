"""Spec verifiers: what a legal graph looks like at each stage, written as PatternMatchers of yes/no rules.

Each rule returns True (the node is legal), False (it is not) or None (no opinion: the next rule is tried); a node that
no rule accepts is illegal. With SPEC=1 the scheduler checks the tensor graph (`verify_tensor_graph`), and codegen
checks every kernel AST (`verify_kernel`) and linear program (`verify_linear`). A violation raises a RuntimeError naming
the stage, the node (op, dtype, arg) and the rule that rejected it.
"""
from __future__ import annotations

from typing import Any

from fusegrad.dtype import PtrDType, dtypes
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.ir.pattern import PatternMatcher, UPat

# ---------------------------------------------------------------------------------------------------------------------
# checks shared by the stages

_FLOAT_ONLY = {Ops.RECIPROCAL, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC}
_INT_ONLY = {Ops.IDIV, Ops.MOD, Ops.SHL, Ops.SHR}
_BITWISE = {Ops.AND, Ops.OR, Ops.XOR}


def _alu_ok(x: UOp) -> bool:
    """Arity and dtypes of an ALU op: sources share the output dtype, except comparisons (-> bool) and WHERE."""
    s, dt = x.src, x.dtype
    if len(s) != (1 if x.op in GroupOp.Unary else 2 if x.op in GroupOp.Binary else 3): return False
    if x.op in GroupOp.Comparison: return dt.scalar() == dtypes.bool and s[0].dtype == s[1].dtype != dtypes.void
    if x.op is Ops.WHERE: return s[0].dtype.scalar() == dtypes.bool and s[1].dtype == s[2].dtype == dt
    if dt == dtypes.void or any(v.dtype != dt for v in s): return False
    if x.op in _FLOAT_ONLY: return dtypes.is_float(dt)
    if x.op in _INT_ONLY: return dtypes.is_int(dt)
    if x.op in _BITWISE: return dtypes.is_int(dt) or dtypes.is_bool(dt)
    return True


def _const_ok(x: UOp) -> bool:
    """The arg is the Python type of the dtype, in its range."""
    d, v = x.dtype.scalar(), x.arg
    if isinstance(v, UOp): return dtypes.is_int(v.dtype) and v.shape is None   # a symbolic int (tensor level)
    if dtypes.is_bool(d): return isinstance(v, bool)
    if dtypes.is_int(d): return isinstance(v, int) and not isinstance(v, bool) and dtypes.min(d) <= v <= dtypes.max(d)
    return dtypes.is_float(d) and isinstance(v, float)


def _cast_ok(x: UOp, y: UOp) -> bool:
    if x.dtype == dtypes.void or y.dtype == dtypes.void: return False
    return x.op is Ops.CAST or x.dtype.itemsize == y.dtype.itemsize  # a bitcast keeps the bit width


def _shape_ok(x: UOp) -> bool:
    """The node has a shape and shape inference accepts it (movement args valid, ALU source shapes equal)."""
    try: return x.shape is not None
    except Exception: return False  # malformed args make shape inference raise


def _reduce_axis_ok(x: UOp, y: UOp) -> bool:
    if not (isinstance(x.arg, tuple) and len(x.arg) == 2 and x.arg[0] in GroupOp.Reduce): return False
    axes, ndim = x.arg[1], len(y.shape or ())
    return isinstance(axes, tuple) and len(axes) > 0 and all(isinstance(a, int) and 0 <= a < ndim for a in axes) \
        and list(axes) == sorted(set(axes)) and x.dtype == y.dtype and _shape_ok(x)


def _range_ok(x: UOp) -> bool:
    return dtypes.is_int(x.dtype) and isinstance(x.arg, tuple) and x.src[0].dtype == x.dtype


_BUF = UPat((Ops.PARAM, Ops.DEFINE_REG, Ops.DEFINE_LOCAL), name="buf")


def _elem_ok(x: UOp, buf: UOp) -> bool:
    """An INDEX addresses one element of its buffer, or (VECTORIZE) a run of N consecutive elements as one vector."""
    base = buf.dtype.base
    return x.dtype == base or (base.count == 1 and x.dtype.count > 1 and x.dtype.scalar() == base)
_VALUE = UPat(GroupOp.ALU | {Ops.CONST, Ops.CAST, Ops.BITCAST}, name="x")

# rules valid in kernel ASTs and linear programs alike
_scalar_rules = [
    (UPat(Ops.CONST, src=(), name="x"), _const_ok),                                      # a plain constant
    (UPat(GroupOp.ALU, name="x"), _alu_ok),                                              # math on scalars
    (UPat((Ops.CAST, Ops.BITCAST), src=(UPat.var("y"),), name="x"), _cast_ok),           # dtype conversion
    (UPat(Ops.PARAM, src=(), name="x"),
     lambda x: isinstance(x.dtype, PtrDType) and isinstance(x.arg, int) and x.arg >= 0),  # a kernel buffer argument
    (UPat(Ops.DEFINE_VAR, src=(), name="x"), lambda x: dtypes.is_int(x.dtype) and isinstance(x.arg, tuple)
     and len(x.arg) in (3, 4) and isinstance(x.arg[0], str) and x.arg[1] <= x.arg[2]
     and (len(x.arg) == 3 or x.arg[3] >= 1)),          # a bounded symbolic int (name, min, max[, multiple_of])
    (UPat(Ops.SPECIAL, src=(UPat.var("n"),), name="x"),
     lambda x, n: dtypes.is_int(x.dtype) and n.dtype == x.dtype and isinstance(x.arg, str)),  # a hardware index
    (UPat(Ops.INDEX, src=(_BUF, UPat.var("i")), name="x"),                             # buf[i]: ptr base -> element
     lambda x, buf, i: dtypes.is_int(i.dtype) and _elem_ok(x, buf)),
    (UPat(Ops.INDEX, src=(_BUF, UPat.var("i"), UPat.var("g")), name="x"),                 # buf[i] if gate
     lambda x, buf, i, g: dtypes.is_int(i.dtype) and g.dtype.scalar() == dtypes.bool and _elem_ok(x, buf)),
    (UPat(Ops.INDEX, src=(_BUF, UPat.var("i"), UPat.var("g"), UPat.var("lanes")), name="x"),  # buf[i:i+N] lane by lane
     lambda x, buf, i, g, lanes: dtypes.is_int(i.dtype) and g.dtype == dtypes.bool and x.dtype.count > 1 and
     lanes.dtype == dtypes.bool.vec(x.dtype.count) and _elem_ok(x, buf)),    # if lanes[k]; all of them if g
    (UPat(Ops.VECTORIZE, name="x"), lambda x: len(x.src) == x.dtype.count > 1 and
     all(s.dtype == x.dtype.scalar() for s in x.src)),                                 # scalars -> vector
    (UPat(Ops.GEP, src=(UPat.var("v"),), name="x"), lambda x, v: isinstance(x.arg, int) and 0 <= x.arg < v.dtype.count
     and x.dtype == v.dtype.scalar()),                                                 # vector element
]

# ---------------------------------------------------------------------------------------------------------------------
# the three stages

tensor_spec = PatternMatcher([
    (UPat(Ops.SINK, name="x"), lambda x: len(x.src) > 0 and all(_shape_ok(s) for s in x.src)),  # roots are tensors
    (UPat(Ops.DEVICE, src=(), name="x"), lambda x: isinstance(x.arg, str)),                 # a device name
    (UPat(Ops.BUFFER, src=(UPat(Ops.DEVICE),), name="x"), lambda x: isinstance(x.arg, tuple) and len(x.arg) == 2
     and all(isinstance(a, int) for a in x.arg) and x.arg[1] >= 0),                      # (id, size) on a device
    (UPat(Ops.CONST, src=(UPat(Ops.DEVICE),), name="x"), _const_ok),                        # a 0-d tensor constant
    (UPat(Ops.IOTA, src=(UPat(Ops.DEVICE),), name="x"),
     lambda x: isinstance(x.arg, int) and x.arg >= 0 and x.dtype != dtypes.void),         # 0..arg-1
    (UPat(Ops.COPY, src=(UPat.var("y"),), name="x"),
     lambda x, y: isinstance(x.arg, str) and x.dtype == y.dtype and _shape_ok(x)),        # to another device
    (UPat((Ops.CONTIGUOUS, Ops.DETACH), src=(UPat.var("y"),), name="x"),
     lambda x, y: x.dtype == y.dtype and _shape_ok(x)),                                   # keep value and dtype
    (UPat(Ops.DETACH, name="x"), lambda x: x.arg is not None and len(x.src) > 1 and x.dtype == x.src[0].dtype
     and _shape_ok(x)),                                                                   # value + inputs of a GradFn
    (UPat(GroupOp.Movement, src=(UPat.var("y"),), name="x"),
     lambda x, y: x.dtype == y.dtype and _shape_ok(x)),                                   # views: valid args
    (UPat(Ops.REDUCE_AXIS, src=(UPat.var("y"),), name="x"), _reduce_axis_ok),              # (op, sorted axes)
    (UPat(Ops.GATHER, src=(UPat.var("y"), UPat.var("i")), name="x"), lambda x, y, i: isinstance(x.arg, int)
     and 0 <= x.arg < len(y.shape or ()) and dtypes.is_int(i.dtype) and x.dtype == y.dtype and _shape_ok(x)),  # y[i]
    (UPat(Ops.ASSIGN, src=(UPat.var("t"), UPat.var("v")), name="x"), lambda x, t, v: t.base.op is Ops.BUFFER
     and x.dtype == t.dtype == v.dtype and isinstance(x.arg, int) and _shape_ok(x)),      # write v into t's buffer
    (UPat(GroupOp.ALU, name="x"), lambda x: _alu_ok(x) and _shape_ok(x)),                  # same-shape sources
    (UPat((Ops.CAST, Ops.BITCAST), src=(UPat.var("y"),), name="x"), lambda x, y: _cast_ok(x, y) and _shape_ok(x)),
])

kernel_spec = PatternMatcher([
    (UPat(GroupOp.TensorOnly - {Ops.SINK}), lambda: False),                                # never reach a kernel
    (UPat(Ops.SINK, dtype=dtypes.void, src=UPat(Ops.STORE), name="x"), lambda x: len(x.src) > 0),  # SINK of STOREs
    (UPat(Ops.STORE, dtype=dtypes.void, src=(UPat(Ops.INDEX, src=(UPat(Ops.PARAM),), allow_any_len=True, name="idx"),
                                             UPat.var("v"))), lambda idx, v: v.dtype == idx.dtype),  # out[i] = v
    (UPat(Ops.LOAD, src=(UPat(Ops.INDEX, src=(UPat(Ops.PARAM),), allow_any_len=True, name="idx"),), name="x"),
     lambda x, idx: x.dtype == idx.dtype),                                                # reads a kernel buffer
    (UPat(Ops.RANGE, src=(UPat.cvar("n"),), name="x"),
     lambda x, n: _range_ok(x) and n.arg >= 1),                                           # loop of constant size
    (UPat(Ops.RANGE, src=(UPat.var("n"),), name="x"), lambda x, n: _range_ok(x) and n.op is not Ops.CONST and
     n.dtype == x.dtype and any(u.op is Ops.DEFINE_VAR for u in n.toposort())),          # loop of symbolic size
    (UPat(Ops.REDUCE, src=(UPat.var("v"),), allow_any_len=True, name="x"), lambda x, v: x.arg in GroupOp.Reduce and
     x.dtype == v.dtype and len(x.src) >= 2 and all(r.op is Ops.RANGE for r in x.src[1:])
     and len(set(x.src[1:])) == len(x.src) - 1),                                          # (value, *RANGE)
    *_scalar_rules,
])

linear_spec = PatternMatcher([
    (UPat(Ops.RANGE, src=(UPat.var("n"),), name="x"), lambda x, n: _range_ok(x)),           # for (i = 0; i < n; i++)
    (UPat(Ops.END, src=(UPat(Ops.RANGE),), allow_any_len=True), lambda: True),            # closes the loop
    (UPat(Ops.IF, src=(UPat.var("c"),), allow_any_len=True), lambda c: c.dtype == dtypes.bool),  # if (c)
    (UPat(Ops.ENDIF, src=(UPat(Ops.IF),)), lambda: True),                                   # closes the if
    (UPat(Ops.BARRIER), lambda: True),                                                      # workgroup sync
    (UPat(Ops.DEFINE_REG, src=(), name="x"),
     lambda x: isinstance(x.dtype, PtrDType) and x.dtype.addrspace == "reg"),             # register array
    (UPat(Ops.DEFINE_LOCAL, src=(), name="x"),
     lambda x: isinstance(x.dtype, PtrDType) and x.dtype.addrspace == "local"),           # shared memory
    (UPat(Ops.STORE, dtype=dtypes.void, src=(UPat(Ops.INDEX, name="idx"), UPat.var("v")), allow_any_len=True),
     lambda idx, v: v.dtype == idx.dtype),                                                # *idx = v
    (UPat(Ops.LOAD, src=(UPat(Ops.INDEX, name="idx"),), allow_any_len=True, name="x"),
     lambda x, idx: x.dtype == idx.dtype),                                                # *idx (after deps)
    *_scalar_rules,
])

# ---------------------------------------------------------------------------------------------------------------------
# entry points


def _fail(stage: str, u: UOp, why: str) -> None:
    raise RuntimeError(f"SPEC {stage} stage: illegal node (op={u.op}, dtype={u.dtype}, arg={u.arg!r}): {why}")


def _check(pm: PatternMatcher, u: UOp, stage: str, ctx: Any = None) -> None:
    """The first rule with an opinion decides; none at all means the op isn't allowed at this stage."""
    for rule in pm.by_op[u.op]:
        for captures in rule.pat.match(u, {}):
            ok = rule.fn(ctx=ctx, **captures) if rule.takes_ctx else rule.fn(**captures)
            if ok is None: continue
            if not ok: _fail(stage, u, f"rejected by the rule at {rule.location[0]}:{rule.location[1]}")
            return
    _fail(stage, u, f"no rule allows {u.op} with these sources ({', '.join(str(s.op) for s in u.src)})")


def verify_tensor_graph(sink: UOp) -> None:
    """The lazy graph handed to the scheduler: tensor-level ops, ALU, CAST/BITCAST and device constants only."""
    if sink.op is not Ops.SINK: _fail("tensor", sink, "the root must be a SINK")
    for u in sink.toposort(): _check(tensor_spec, u, "tensor")


def verify_kernel(ast: UOp) -> None:
    """One kernel AST: SINK of STOREs into INDEX(PARAM), constant-size RANGEs, REDUCEs of (value, *RANGE)."""
    if ast.op is not Ops.SINK: _fail("kernel", ast, "the root must be a SINK")
    slots: dict[int, UOp] = {}
    for u in ast.toposort():
        _check(kernel_spec, u, "kernel")
        if u.op is Ops.PARAM and slots.setdefault(u.arg, u) is not u: _fail("kernel", u, "two PARAMs share this slot")


def verify_linear(uops: list[UOp]) -> None:
    """A linear program: Linear ops only, sources defined before use and in scope, RANGE/END and IF/ENDIF nested."""
    defined: set[UOp] = set()
    dead: set[UOp] = set()                         # values declared inside a block that is closed
    blocks: list[UOp] = []                         # open RANGEs and IFs, innermost last
    scopes: list[list[UOp]] = [[]]                 # values declared in each open block
    for i, u in enumerate(uops):
        stage = f"linear (instruction {i})"
        if u.op not in GroupOp.Linear: _fail(stage, u, f"{u.op} is not an op of the linear program")
        for s in u.src:
            if s not in defined: _fail(stage, u, f"source {s.op} {s.dtype} {s.arg!r} is used before it is defined")
            if s in dead: _fail(stage, u, f"source {s.op} {s.dtype} {s.arg!r} is used outside the block defining it")
        _check(linear_spec, u, stage)
        if u.op in (Ops.END, Ops.ENDIF):
            if not blocks or blocks[-1] is not u.src[0]:
                _fail(stage, u, f"closes {u.src[0].op} {u.src[0].arg!r} but the innermost open block is "
                                f"{'none' if not blocks else f'{blocks[-1].op} {blocks[-1].arg!r}'}")
            dead.update(scopes.pop())
            dead.add(blocks.pop())
        defined.add(u)
        if u.op in (Ops.RANGE, Ops.IF):
            blocks.append(u)
            scopes.append([])
        elif u.op not in (Ops.CONST, Ops.PARAM, Ops.DEFINE_VAR):  # those are global names, never block-scoped
            scopes[-1].append(u)
    if blocks: _fail("linear", blocks[-1], f"{len(blocks)} block(s) never closed")
