"""Sequence, Optional and control-flow ops (If, Loop, Scan, SequenceMap) and the string ops, which work on
numpy object arrays rather than Tensors (StringConcat, RegexFullMatch, StringSplit, StringNormalizer, LabelEncoder)."""

from __future__ import annotations

import numpy as np

import re
from fusegrad.onnx.ops.base import norm_axis, as_str_array, op, to_tensor
from fusegrad.tensor import Tensor


# ---------------------------------------------------------------- sequences
@op("SequenceConstruct")
def _seqc(ctx, *xs):
    return list(xs)


@op("SequenceEmpty")
def _seqe(ctx, dtype=None):
    return []


@op("SequenceAt")
def _seqat(ctx, seq, pos):
    return seq[int(ctx.np(1).reshape(-1)[0])]


@op("SequenceLength")
def _seqlen(ctx, seq):
    return Tensor(np.array(len(seq), np.int64))


@op("SequenceInsert")
def _seqins(ctx, seq, t, pos=None):
    s = list(seq)
    if pos is None:
        s.append(t)
    else:
        p = int(ctx.np(2).reshape(-1)[0])
        s.insert(p + len(s) if p < 0 else p, t)
    return s


@op("SequenceErase")
def _seqerase(ctx, seq, pos=None):
    s = list(seq)
    p = -1 if pos is None else int(ctx.np(1).reshape(-1)[0])
    del s[p]
    return s


@op("ConcatFromSequence")
def _concatseq(ctx, seq, axis, new_axis=0):
    if new_axis:
        return Tensor.stack(*seq, dim=axis) if len(seq) > 1 else seq[0].unsqueeze(axis)
    return seq[0].cat(*seq[1:], dim=axis) if len(seq) > 1 else seq[0]


@op("SplitToSequence")
def _splitseq(ctx, x, split=None, axis=0, keepdims=1):
    a = norm_axis(axis, x.ndim)
    if split is None:
        parts = x.split(1, dim=a)
        return [p.squeeze(a) for p in parts] if not keepdims else list(parts)
    sp = ctx.np(1)
    if sp.ndim == 0 or (sp.size == 1 and int(sp.reshape(-1)[0]) != x.shape[a]):
        return list(x.split(int(sp.reshape(-1)[0]), dim=a))
    return list(x.split([int(v) for v in sp], dim=a))


# ---------------------------------------------------------------- optional and control flow
@op("Optional")
def _optional(ctx, x=None, type=None):
    return x


@op("OptionalHasElement")
def _opthas(ctx, x=None):
    return Tensor(np.array(x is not None))


@op("OptionalGetElement")
def _optget(ctx, x):
    return x


@op("If")
def _if(ctx, cond, then_branch, else_branch):
    g = then_branch if bool(ctx.np(0).reshape(-1)[0]) else else_branch
    scope, npscope = dict(ctx.scope), dict(ctx.npscope)
    ctx.runner._load_initializers(g, scope, npscope)
    outs = ctx.runner.run_graph(g, scope, npscope)
    return tuple(outs.values())


@op("Loop")
def _loop(ctx, M, cond, *v_init, body):
    trip = None if M is None else int(ctx.np(0).reshape(-1)[0])
    keep = True if cond is None else bool(ctx.np(1).reshape(-1)[0])
    vals = list(v_init)
    n_state = len(vals)
    scans: list[list] = []
    i = 0
    while (trip is None or i < trip) and keep:
        scope, npscope = dict(ctx.scope), dict(ctx.npscope)
        ctx.runner._load_initializers(body, scope, npscope)
        names = [v.name for v in body.input]
        scope[names[0]] = Tensor(np.array(i, np.int64))
        npscope[names[0]] = np.array(i, np.int64)
        scope[names[1]] = Tensor(np.array(keep))
        npscope[names[1]] = np.array(keep)
        for n, v in zip(names[2:], vals):
            scope[n] = v
        outs = list(ctx.runner.run_graph(body, scope, npscope).values())
        # one realize per iteration (the condition is read anyway): the state stays a buffer, not a lazy graph as
        # deep as the trip count that every later kernel would fuse and recompute
        if live := [o for o in outs if isinstance(o, Tensor)]: Tensor.realize(*live)
        keep = bool(outs[0].numpy().reshape(-1)[0]) if isinstance(outs[0], Tensor) else bool(outs[0])
        vals = outs[1 : 1 + n_state]
        for j, s in enumerate(outs[1 + n_state :]):
            if len(scans) <= j:
                scans.append([])
            scans[j].append(s)
        i += 1
    n_scan = len(ctx.node.output) - n_state
    res = vals + [(Tensor.stack(*s) if len(s) > 1 else s[0].unsqueeze(0)) for s in scans]
    for _ in range(n_scan - len(scans)):
        res.append(Tensor.zeros(0))
    return tuple(res)


@op("Scan")
def _scan(
    ctx,
    *args,
    body,
    num_scan_inputs,
    scan_input_axes=None,
    scan_input_directions=None,
    scan_output_axes=None,
    scan_output_directions=None,
):
    n_state = len(args) - num_scan_inputs
    state, xs = list(args[:n_state]), list(args[n_state:])
    in_ax = scan_input_axes or [0] * len(xs)
    in_dir = scan_input_directions or [0] * len(xs)
    T = xs[0].shape[norm_axis(in_ax[0], xs[0].ndim)]
    names = [v.name for v in body.input]
    outs_acc: list[list] = []
    for t in range(T):
        scope, npscope = dict(ctx.scope), dict(ctx.npscope)
        ctx.runner._load_initializers(body, scope, npscope)
        for n, v in zip(names, state):
            scope[n] = v
        for k, x in enumerate(xs):
            a = norm_axis(in_ax[k], x.ndim)
            tt = T - 1 - t if in_dir[k] else t
            scope[names[n_state + k]] = x[(slice(None),) * a + (tt,)]
        outs = list(ctx.runner.run_graph(body, scope, npscope).values())
        state = outs[:n_state]
        for j, o in enumerate(outs[n_state:]):
            if len(outs_acc) <= j:
                outs_acc.append([])
            outs_acc[j].append(o)
    out_ax = scan_output_axes or [0] * len(outs_acc)
    out_dir = scan_output_directions or [0] * len(outs_acc)
    res = list(state)
    for j, s in enumerate(outs_acc):
        if out_dir[j]:
            s = s[::-1]
        a = norm_axis(out_ax[j], s[0].ndim + 1)
        res.append(Tensor.stack(*s, dim=a) if len(s) > 1 else s[0].unsqueeze(a))
    return tuple(res)


@op("SequenceMap")
def _seqmap(ctx, seq, *others, body):
    names = [v.name for v in body.input]
    outs: list[list] = [[] for _ in body.output]
    for i in range(len(seq)):
        scope, npscope = dict(ctx.scope), dict(ctx.npscope)
        ctx.runner._load_initializers(body, scope, npscope)
        scope[names[0]] = seq[i]
        for n, o in zip(names[1:], others):
            scope[n] = o[i] if isinstance(o, list) else o
        for j, v in enumerate(ctx.runner.run_graph(body, scope, npscope).values()):
            outs[j].append(v)
    return tuple(outs)


# ---------------------------------------------------------------- strings (numpy object arrays, not Tensors)
@op("StringConcat")
def _strconcat(ctx, a, b):
    return np.asarray(np.frompyfunc(lambda p, q: p + q, 2, 1)(as_str_array(a), as_str_array(b)), dtype=object)


@op("RegexFullMatch")
def _regex(ctx, x, pattern=""):

    rx = re.compile(pattern)
    match = np.vectorize(lambda s: rx.fullmatch(s) is not None, otypes=[bool])
    return Tensor(match(as_str_array(x)).reshape(np.shape(x)))


@op("StringSplit")
def _strsplit(ctx, x, delimiter=None, maxsplit=None):
    xs = as_str_array(x)
    parts = [(s.split(delimiter or None, -1 if maxsplit is None else maxsplit)) for s in xs.reshape(-1)]
    n = max([len(p) for p in parts], default=0)
    y = np.full((len(parts), n), "", dtype=object)
    for i, p in enumerate(parts):
        y[i, : len(p)] = p
    return y.reshape(*xs.shape, n), Tensor(np.array([len(p) for p in parts], np.int64).reshape(xs.shape))


@op("StringNormalizer")
def _strnorm(ctx, x, case_change_action="NONE", is_case_sensitive=0, locale=None, stopwords=None):
    xs = as_str_array(x)
    flat = list(xs.reshape(-1))
    stop = set(stopwords or [])
    if is_case_sensitive:
        flat = [s for s in flat if s not in stop]
    else:
        low = {w.lower() for w in stop}
        flat = [s for s in flat if s.lower() not in low]
    if case_change_action == "LOWER":
        flat = [s.lower() for s in flat]
    elif case_change_action == "UPPER":
        flat = [s.upper() for s in flat]
    if not flat:
        flat = [""]
    out = np.array(flat, dtype=object)
    return out.reshape(1, -1) if xs.ndim == 2 else out


@op("LabelEncoder")
def _labelenc(
    ctx,
    x,
    default_float=-0.0,
    default_int64=-1,
    default_string="_Unused",
    default_tensor=None,
    keys_floats=None,
    keys_int64s=None,
    keys_strings=None,
    keys_tensor=None,
    values_floats=None,
    values_int64s=None,
    values_strings=None,
    values_tensor=None,
):
    keys = next(k for k in (keys_floats, keys_int64s, keys_strings, keys_tensor) if k is not None)
    vals = next(v for v in (values_floats, values_int64s, values_strings, values_tensor) if v is not None)
    keys, vals = list(np.asarray(keys).reshape(-1)), np.asarray(vals).reshape(-1)
    if values_tensor is not None:
        default = np.asarray(default_tensor).reshape(-1)[0] if default_tensor is not None else 0
    else:
        default = (
            default_float
            if values_floats is not None
            else default_int64
            if values_int64s is not None
            else default_string
        )
    table = dict(zip(keys, vals))
    xa = x if isinstance(x, np.ndarray) else x.numpy()
    odt = vals.dtype if vals.dtype.kind != "U" else object
    out = np.array([table.get(k, default) for k in xa.reshape(-1)], dtype=odt)
    out = out.reshape(xa.shape)
    return out if out.dtype == object else to_tensor(out)
