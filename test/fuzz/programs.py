"""Differential program fuzzer: random whole training programs run three ways, by default, in reference mode
(`Context(REFERENCE=1)`: TinyJit runs each call eagerly, no schedule, result or relayout cache) and in PyTorch doing the
same steps; losses, eval outputs and every parameter and buffer must agree.

A seed gives one program (`generate(seed)`), printable as Python-like steps (`render`). A program builds a small model
from fusegrad.nn (Conv2d with optional BatchNorm2d, or Embedding; optional LayerNorm; Linear), an optimizer (SGD with
momentum / nesterov / weight decay, Adam, AdamW) and then runs 6-16 steps drawn from:

  train / train_eager   a TinyJit'd train step (zero_grad, backward, step), or the same function called eagerly
  eval                  a TinyJit'd eval step (BatchNorm on its running statistics), interleaved with training
  accum                 gradient accumulation across two jitted functions: a micro-batch function adds each gradient
                        into a buffer with assign, an update function steps the optimizer on them and zeroes them
  slice_add, scale      writes to a parameter: `w[a:b] += c`, `w.assign(w * c)`
  view_make/_read/_add  a view `v = w[a:b]` kept across steps, read and written through
  lazy_begin/_end       a lazy read `r = w * 2` built now and read steps later (it keeps its value at build time)
  dl_input              the batch comes through DLPack from a torch tensor that torch overwrites in place each time
  dl_np_write           `np.from_dlpack(w)` written from NumPy; dl_torch_write: `torch.from_dlpack(w)` from torch
  disk_save/open/load   a parameter written to a DISK tensor file, a lazy read of it opened, loaded back later
  safe_roundtrip        the state dict through safetensors (safe_save, safe_load, load_state_dict)
  shard_add             `s = w.shard(("CPU", "CPU:1")); s += c1; s.numpy(); s += c2; w.assign(s.to("CPU"))`
  shard_eval            the model with parameters replicated on ("CPU", "CPU:1") evaluates a batch sharded on axis 0
  check                 every parameter and buffer read now (reads realize; the end always checks)

Tolerances (float32): default vs reference mode, rtol 5e-4 atol 5e-5 (the same math; fusion and relayouts may
differ); either vs PyTorch rtol 2e-3 atol 2e-4 (other kernels and summation orders, compounded over up to 16 optimizer
steps; Adam's eps is drawn >= 1e-4 so a near-zero gradient can't turn rounding noise into a full-size step; 1e-2 where a
conv bias feeds BatchNorm, whose gradient is zero up to rounding). Integer state (num_batches_tracked) is compared
exactly.

Run it long: `PYTHONPATH=. python test/fuzz/programs.py --n 2000 --seed 0` (progress per 50 programs; the first
program with each new finding is reduced to a minimal program, printed with the command that replays it:
`--seed S --keep 0,3,5`). test/fuzz/test_programs.py runs a few fixed seeds in CI. docs/debugging.md ("REFERENCE=1:
reference mode, and the program fuzzer") describes it.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fusegrad import Context, Tensor, TinyJit, nn
from fusegrad.dtype import dtypes
from fusegrad.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save

DEVS = ("CPU", "CPU:1")
B, HW, SEQ, NBATCH = 4, 6, 5, 4
TIGHT, LOOSE = (5e-4, 5e-5), (2e-3, 2e-4)   # (rtol, atol): default vs reference; either vs torch


@dataclass(frozen=True)
class Spec:
    arch: str          # "conv" (Conv2d [+ BatchNorm2d]) or "embed" (Embedding)
    cin: int
    ch: int
    out: int
    bn: bool
    ln: bool
    bias: bool
    loss: str          # "mse" or "ce"
    opt: str           # "sgd", "adam", "adamw"
    opt_kw: tuple      # sorted (name, value) pairs
    vocab: int = 7


@dataclass
class Program:
    seed: int
    spec: Spec
    steps: list[tuple] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------------------
# generation

def param_names(spec: Spec) -> list[str]:
    names = ["conv.weight"] + (["conv.bias"] if spec.bias else []) if spec.arch == "conv" else ["emb.weight"]
    if spec.arch == "conv" and spec.bn: names += ["bn.weight", "bn.bias"]
    if spec.ln: names += ["ln.weight", "ln.bias"]
    return names + ["fc.weight", "fc.bias"]


def param_shape(spec: Spec, name: str) -> tuple[int, ...]:
    return {"conv.weight": (spec.ch, spec.cin, 3, 3), "conv.bias": (spec.ch,), "bn.weight": (spec.ch,),
            "bn.bias": (spec.ch,), "emb.weight": (spec.vocab, spec.ch), "ln.weight": (spec.ch,),
            "ln.bias": (spec.ch,), "fc.weight": (spec.out, spec.ch), "fc.bias": (spec.out,)}[name]


STEP_WEIGHTS = {"train": 24, "train_eager": 5, "eval": 14, "accum": 7, "slice_add": 5, "scale": 3, "view_make": 3,
                "view_read": 3, "view_add": 3, "lazy_begin": 3, "lazy_end": 3, "dl_input": 4, "dl_np_write": 3,
                "dl_torch_write": 3, "disk_save": 3, "disk_open": 3, "disk_load": 3, "safe_roundtrip": 2,
                "shard_add": 3, "shard_eval": 3, "check": 8}


# steps that write parameters (run under Tensor.no_grad, as torch needs torch.no_grad() for them)
WRITES = {"slice_add", "scale", "view_add", "dl_np_write", "dl_torch_write", "disk_load", "safe_roundtrip", "shard_add"}


def generate(seed: int) -> Program:
    """The program of `seed` (the same on every machine: Python's random.Random)."""
    r = random.Random(seed)
    arch = r.choice(["conv", "conv", "embed"])
    opt = r.choice(["sgd", "adam", "adamw"])
    lr = r.choice([0.01, 0.03, 0.1]) if opt == "sgd" else r.choice([0.003, 0.01, 0.03])
    if opt == "sgd":
        mom = r.choice([0.0, 0.9])
        kw = {"lr": lr, "momentum": mom, "weight_decay": r.choice([0.0, 0.01]), "nesterov": mom > 0 and r.random() < .5}
    else:
        kw = {"lr": lr, "eps": r.choice([1e-4, 1e-3])}
        if opt == "adamw": kw["weight_decay"] = r.choice([0.01, 0.1])
    spec = Spec(arch, 3, r.choice([4, 8]), r.choice([3, 5]), arch == "conv" and r.random() < 0.7, r.random() < 0.5,
                r.random() < 0.7, r.choice(["mse", "ce"]), opt, tuple(sorted(kw.items())))
    # a conv bias right before BatchNorm has a gradient of zero in exact arithmetic: Adam scales its rounding noise
    # (which differs with the kernels' summation order) up to steps of lr * noise / eps, beyond any fair tolerance
    # unless eps is large (seed 4310 with eps 1e-4: 1.6e-4 apart at an eval)
    if spec.bn and spec.bias and opt != "sgd": spec = replace(spec, opt_kw=tuple(sorted({**kw, "eps": 1e-2}.items())))
    names = param_names(spec)
    kinds, weights = zip(*STEP_WEIGHTS.items())
    steps: list[tuple] = []
    views: list[int] = []
    lazies: list[int] = []
    saved: set[str] = set()
    opened: set[str] = set()
    for _ in range(r.randint(6, 16)):
        k = r.choices(kinds, weights)[0]
        bi = r.randrange(NBATCH)
        pn = r.choice(names)
        rows = param_shape(spec, pn)[0]
        a = r.randrange(rows)
        b = r.randint(a + 1, rows)
        c = r.choice([-0.5, 0.25, 1.0])
        if k in ("train", "train_eager", "eval", "dl_input", "shard_eval"): steps.append((k, bi))
        elif k == "accum": steps.append((k, bi, (bi + 1) % NBATCH))
        elif k == "slice_add": steps.append((k, pn, a, b, c))
        elif k == "scale": steps.append((k, pn, r.choice([0.5, 1.5])))
        elif k == "view_make":
            views.append(len(views))
            steps.append((k, views[-1], pn, a, b))
        elif k in ("view_read", "view_add"):
            if not views: continue
            steps.append((k, r.choice(views)) + ((c,) if k == "view_add" else ()))
        elif k == "lazy_begin":
            lazies.append(len(lazies))
            steps.append((k, lazies[-1], pn))
        elif k == "lazy_end":
            if not lazies: continue
            steps.append((k, lazies.pop(r.randrange(len(lazies)))))
        elif k in ("dl_np_write", "dl_torch_write"): steps.append((k, pn, a, c))
        elif k == "disk_save":
            saved.add(pn)
            steps.append((k, pn))
        elif k == "disk_open":
            if not saved: continue
            pn = r.choice(sorted(saved))
            opened.add(pn)
            steps.append((k, pn))
        elif k == "disk_load":
            if not opened: continue
            steps.append((k, r.choice(sorted(opened))))
        elif k == "shard_add": steps.append((k, pn, c, r.choice([1.0, 2.0])))
        else: steps.append((k,))
    return Program(seed, spec, steps)


def data(prog: Program) -> tuple[dict[str, np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    """Initial state (torch's state-dict names) and the batches, from the program's seed."""
    s, rng = prog.spec, np.random.default_rng(prog.seed)
    init = {n: (rng.standard_normal(param_shape(s, n)) * 0.4).astype(np.float32) for n in param_names(s)}
    if s.bn: init.update({"bn.weight": (1 + 0.1 * rng.standard_normal(s.ch)).astype(np.float32),
                          "bn.running_mean": np.zeros(s.ch, np.float32), "bn.running_var": np.ones(s.ch, np.float32),
                          "bn.num_batches_tracked": np.zeros((), np.int64)})
    if s.ln: init["ln.weight"] = (1 + 0.1 * rng.standard_normal(s.ch)).astype(np.float32)
    batches = []
    for _ in range(NBATCH):
        x = rng.standard_normal((B, s.cin, HW, HW)).astype(np.float32) if s.arch == "conv" else \
            rng.integers(0, s.vocab, (B, SEQ)).astype(np.int32)
        y = rng.standard_normal((B, s.out)).astype(np.float32) if s.loss == "mse" else \
            rng.integers(0, s.out, (B,)).astype(np.int32)
        batches.append((x, y))
    return init, batches


def render(prog: Program) -> str:
    """The program as Python-like lines (x[i], y[i]: batch i; train_j/eval_j/micro_j/apply_j: the TinyJit'd steps)."""
    s = prog.spec
    layers = (f"Conv2d({s.cin}, {s.ch}, 3, padding=1, bias={s.bias})" + (f", BatchNorm2d({s.ch})" if s.bn else "")
              if s.arch == "conv" else f"Embedding({s.vocab}, {s.ch})") + (f", LayerNorm({s.ch})" if s.ln else "") + \
        f", Linear({s.ch}, {s.out})"
    lines = [f"# seed {prog.seed}: model [{layers}], loss {s.loss}, "
             f"{s.opt}({', '.join(f'{k}={v}' for k, v in s.opt_kw)})"]
    fmt = {
        "train": "loss = train_j(x[{1}], y[{1}])          # Tensor.training = True",
        "train_eager": "loss = train_step(x[{1}], y[{1}])      # not jitted",
        "eval": "out = eval_j(x[{1}])                     # Tensor.training = False",
        "accum": "micro_j(x[{1}], y[{1}]); micro_j(x[{2}], y[{2}]); apply_j()   # grads summed with assign",
        "slice_add": "{1}[{2}:{3}] += {4}",
        "scale": "{1}.assign({1} * {2})",
        "view_make": "v{1} = {2}[{3}:{4}]",
        "view_read": "read(v{1})",
        "view_add": "v{1} += {2}",
        "lazy_begin": "lazy{1} = {2} * 2",
        "lazy_end": "read(lazy{1})",
        "dl_input": "tx.copy_(torch x[{1}]); loss = train_j(Tensor.from_dlpack(tx) (made once), y[{1}])",
        "dl_np_write": "np.from_dlpack({1}.realize())[{2}] += {3}",
        "dl_torch_write": "torch.from_dlpack({1}.realize())[{2}] *= {3}",
        "disk_save": "{1}.to('disk:{1}.bin').realize()",
        "disk_open": "opened['{1}'] = Tensor.empty(n, device='disk:{1}.bin').reshape(shape).to('CPU')   # lazy",
        "disk_load": "{1}.assign(opened['{1}'])",
        "safe_roundtrip": "safe_save(get_state_dict(model), f); load_state_dict(model, safe_load(f))",
        "shard_add": "s = {1}.shard(('CPU', 'CPU:1'), axis=0); s += {2}; read(s); s += {3}; {1}.assign(s.to('CPU'))",
        "shard_eval": "load_state_dict(sharded_model, get_state_dict(model)); read(sharded_model("
                      "x[{1}].shard(('CPU', 'CPU:1'), axis=0)))",
        "check": "read(every parameter and buffer)",
    }
    for i, st in enumerate(prog.steps): lines.append(f"{i:2d}: " + fmt[st[0]].format(*st))
    lines.append("end: read(every parameter and buffer)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# the fusegrad run (default or reference mode)

def _silu(h: Any) -> Any:
    """The activation: smooth on purpose. ReLU's kink at 0 turns a float32 rounding difference into a different
    gradient when an input lands within ~1e-6 of 0 (seed 21130: a BatchNorm output of 3.8e-6 in float64 that two
    float32 runs, drifted apart by 2e-6 over five steps, put on either side), so both libraries would be "right"."""
    return h * h.sigmoid()


def model_forward(m: Any, x: Any) -> Any:
    """The fuzzed model's forward, one definition for both libraries (the Tensor methods it uses are the same)."""
    if m.s.arch == "conv":
        h = m.conv(x)
        if m.s.bn: h = m.bn(h)
        h = _silu(h).mean((2, 3))
        if m.s.ln: h = m.ln(h)
    else:
        h = m.emb(x)
        if m.s.ln: h = m.ln(h)
        h = _silu(h).mean(1)
    return m.fc(h)


class FGModel:
    def __init__(self, s: Spec):
        self.s = s
        if s.arch == "conv":
            self.conv = nn.Conv2d(s.cin, s.ch, 3, padding=1, bias=s.bias)
            if s.bn: self.bn = nn.BatchNorm2d(s.ch)
        else: self.emb = nn.Embedding(s.vocab, s.ch)
        if s.ln: self.ln = nn.LayerNorm(s.ch)
        self.fc = nn.Linear(s.ch, s.out)

    def __call__(self, x: Tensor) -> Tensor:
        return model_forward(self, x)


def _fg_loss(s: Spec, out: Tensor, y: Tensor) -> Tensor:
    return ((out - y) ** 2).mean() if s.loss == "mse" else out.sparse_categorical_crossentropy(y)


def _fg_opt(s: Spec, params: list[Tensor]) -> Any:
    kw = dict(s.opt_kw)
    if s.opt == "sgd": return nn.optim.SGD(params, **kw)
    if s.opt == "adam": return nn.optim.Adam(params, **kw)
    return nn.optim.AdamW(params, **kw)


class FGRun:
    """Runs a program's steps on fusegrad; every value read goes to `self.out` as (label, numpy array)."""

    def __init__(self, prog: Program, init: dict[str, np.ndarray], batches: list, tmp: str):
        self.s, self.tmp, self.out = prog.spec, tmp, []
        self.batches = batches
        self.model = FGModel(self.s)
        load_state_dict(self.model, {k: Tensor(v.copy()) for k, v in init.items()}, verbose=False)
        self.state = get_state_dict(self.model)
        self.params = [self.state[n] for n in param_names(self.s)]
        Tensor.training = True
        self.opt = _fg_opt(self.s, get_parameters(self.model))
        self.acc = [Tensor.zeros(*p.shape).contiguous().realize() for p in self.params]
        Tensor.training = False
        self.train_j, self.eval_j = TinyJit(self.train_step), TinyJit(self.eval_step)
        self.micro_j, self.apply_j = TinyJit(self.micro), TinyJit(self.apply)
        self.views: dict[int, Tensor] = {}
        self.lazies: dict[int, Tensor] = {}
        self.opened: dict[str, Tensor] = {}
        self.later: list[tuple[str, Tensor]] = []   # outputs read at the end (jit outputs must stay valid)
        self.tx: torch.Tensor | None = None
        self.dlx: Tensor | None = None
        self.sharded: FGModel | None = None

    def train_step(self, x: Tensor, y: Tensor) -> Tensor:
        self.opt.zero_grad()
        loss = _fg_loss(self.s, self.model(x), y)
        loss.backward()
        self.opt.step()
        return loss.realize()

    def eval_step(self, x: Tensor) -> Tensor: return self.model(x).realize()

    def micro(self, x: Tensor, y: Tensor) -> Tensor:
        for p in self.params: p.grad = None
        loss = _fg_loss(self.s, self.model(x), y)
        loss.backward()
        for a, p in zip(self.acc, self.params): a.assign(a + p.grad)
        for p in self.params: p.grad = None
        return loss.realize()

    def apply(self) -> None:
        for a, p in zip(self.acc, self.params): p.grad = a * 0.5
        self.opt.step()
        for a in self.acc: a.assign(a * 0)

    def xy(self, i: int) -> tuple[Tensor, Tensor]:
        x, y = self.batches[i]
        return Tensor(x.copy()), Tensor(y.copy())

    def read_state(self, label: str) -> None:
        for k in sorted(self.state): self.out.append((f"{label} {k}", self.state[k].numpy().copy()))

    def step(self, i: int, st: tuple) -> None:
        if st[0] in WRITES:   # writes to parameters outside training are made without autograd, as torch requires
            prev, Tensor.no_grad = Tensor.no_grad, True
            try: return self._step(i, st)
            finally: Tensor.no_grad = prev
        return self._step(i, st)

    def _step(self, i: int, st: tuple) -> None:
        k, lab = st[0], f"step {i} {st[0]}"
        if k in ("train", "dl_input"):
            x, y = self.xy(st[1])
            if k == "dl_input":
                if self.tx is None:
                    self.tx = torch.zeros(self.batches[0][0].shape, dtype=torch.from_numpy(self.batches[0][0]).dtype)
                    self.dlx = Tensor.from_dlpack(self.tx)
                self.tx.copy_(torch.from_numpy(self.batches[st[1]][0]))
                x = self.dlx
            Tensor.training = True
            try: self.later.append((lab, self.train_j(x, y)))
            finally: Tensor.training = False
        elif k == "train_eager":
            Tensor.training = True
            try: self.later.append((lab, self.train_step(*self.xy(st[1]))))
            finally: Tensor.training = False
        elif k == "eval": self.later.append((lab, self.eval_j(self.xy(st[1])[0])))
        elif k == "accum":
            Tensor.training = True
            try:
                for n, j in enumerate(st[1:]): self.later.append((f"{lab} micro{n}", self.micro_j(*self.xy(j))))
                self.apply_j()
            finally: Tensor.training = False
        elif k == "slice_add":
            p = self.state[st[1]]
            p[st[2]:st[3]] += st[4]
        elif k == "scale": self.state[st[1]].assign(self.state[st[1]] * st[2])
        elif k == "view_make": self.views[st[1]] = self.state[st[2]][st[3]:st[4]]
        elif k == "view_read": self.out.append((lab, self.views[st[1]].numpy().copy()))
        elif k == "view_add":
            v = self.views[st[1]]
            v += st[2]
        elif k == "lazy_begin": self.lazies[st[1]] = self.state[st[2]] * 2
        elif k == "lazy_end": self.out.append((lab, self.lazies.pop(st[1]).numpy().copy()))
        elif k == "dl_np_write":
            a = np.from_dlpack(self.state[st[1]].realize())
            a[st[2]] += st[3]
        elif k == "dl_torch_write":
            t = torch.from_dlpack(self.state[st[1]].realize())
            t[st[2]] *= st[3]
        elif k == "disk_save": self.state[st[1]].to(f"disk:{self.tmp}/{st[1]}.bin").realize()
        elif k == "disk_open":
            shape = param_shape(self.s, st[1])
            self.opened[st[1]] = Tensor.empty(int(np.prod(shape)), dtype=dtypes.float32,
                                              device=f"disk:{self.tmp}/{st[1]}.bin").reshape(shape).to("CPU")
        elif k == "disk_load": self.state[st[1]].assign(self.opened[st[1]])
        elif k == "safe_roundtrip":
            fn = f"{self.tmp}/model.safetensors"
            safe_save(get_state_dict(self.model), fn)
            load_state_dict(self.model, safe_load(fn), verbose=False)
        elif k == "shard_add":
            p = self.state[st[1]]
            s = p.shard(DEVS, axis=0 if p.shape[0] >= 2 else None)
            s += st[2]
            self.out.append((lab, s.numpy().copy()))
            s += st[3]
            p.assign(s.to("CPU"))
        elif k == "shard_eval":
            if self.sharded is None:
                self.sharded = FGModel(self.s)
                for t in get_state_dict(self.sharded).values(): t.shard_(DEVS)
            load_state_dict(self.sharded, get_state_dict(self.model), verbose=False)
            x = self.xy(st[1])[0].shard(DEVS, axis=0)
            self.out.append((lab, self.sharded(x).to("CPU").numpy().copy()))
        elif k == "check": self.read_state(lab)
        else: raise ValueError(f"unknown step {k}")

    def finish(self) -> None:
        self.read_state("end")
        for lab, t in self.later: self.out.append((lab, t.numpy().copy()))


# ---------------------------------------------------------------------------------------------------------------------
# the PyTorch run

class TModel(torch.nn.Module):
    def __init__(self, s: Spec):
        super().__init__()
        self.s = s
        if s.arch == "conv":
            self.conv = torch.nn.Conv2d(s.cin, s.ch, 3, padding=1, bias=s.bias)
            if s.bn: self.bn = torch.nn.BatchNorm2d(s.ch)
        else: self.emb = torch.nn.Embedding(s.vocab, s.ch)
        if s.ln: self.ln = torch.nn.LayerNorm(s.ch)
        self.fc = torch.nn.Linear(s.ch, s.out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return model_forward(self, x)


class TorchRun:
    """The same steps in eager PyTorch (float32, CPU): what every fusegrad run must match."""

    def __init__(self, prog: Program, init: dict[str, np.ndarray], batches: list, tmp: str):
        self.s, self.out, self.later = prog.spec, [], []
        self.batches = batches
        self.model = TModel(self.s)
        self.model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in init.items()})
        kw = dict(self.s.opt_kw)
        if self.s.opt == "sgd": self.opt = torch.optim.SGD(self.model.parameters(), **kw)
        elif self.s.opt == "adam": self.opt = torch.optim.Adam(self.model.parameters(), **kw)
        else: self.opt = torch.optim.AdamW(self.model.parameters(), **kw)
        self.state = dict(self.model.state_dict(keep_vars=True))
        self.params = [self.state[n] for n in param_names(self.s)]
        self.acc = [torch.zeros_like(p) for p in self.params]
        self.views: dict[int, torch.Tensor] = {}
        self.lazies: dict[int, torch.Tensor] = {}
        self.files: dict[str, torch.Tensor] = {}
        self.opened: dict[str, torch.Tensor] = {}

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((out - y) ** 2).mean() if self.s.loss == "mse" else F.cross_entropy(out, y.long())

    def xy(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.batches[i]
        return torch.from_numpy(x.copy()), torch.from_numpy(y.copy())

    def train(self, i: int) -> torch.Tensor:
        self.model.train()
        x, y = self.xy(i)
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        return loss.detach().clone()

    def read_state(self, label: str) -> None:
        for k in sorted(self.state): self.out.append((f"{label} {k}", self.state[k].detach().numpy().copy()))

    @torch.no_grad()
    def step(self, i: int, st: tuple) -> None:
        k, lab = st[0], f"step {i} {st[0]}"
        if k in ("train", "train_eager", "dl_input"):
            with torch.enable_grad(): self.later.append((lab, self.train(st[1])))
        elif k == "eval":
            self.model.eval()
            self.later.append((lab, self.model(self.xy(st[1])[0]).clone()))
        elif k == "accum":
            self.model.train()
            with torch.enable_grad():
                for n, j in enumerate(st[1:]):
                    for p in self.params: p.grad = None
                    x, y = self.xy(j)
                    loss = self.loss(self.model(x), y)
                    loss.backward()
                    for a, p in zip(self.acc, self.params): a.copy_(a + p.grad)
                    self.later.append((f"{lab} micro{n}", loss.detach().clone()))
            for a, p in zip(self.acc, self.params): p.grad = a * 0.5
            self.opt.step()
            for a in self.acc: a.zero_()
        elif k == "slice_add": self.state[st[1]][st[2]:st[3]] += st[4]
        elif k == "scale": self.state[st[1]].mul_(st[2])
        elif k == "view_make": self.views[st[1]] = self.state[st[2]][st[3]:st[4]]
        elif k == "view_read": self.out.append((lab, self.views[st[1]].numpy().copy()))
        elif k == "view_add": self.views[st[1]] += st[2]
        elif k == "lazy_begin": self.lazies[st[1]] = self.state[st[2]] * 2
        elif k == "lazy_end": self.out.append((lab, self.lazies.pop(st[1]).numpy().copy()))
        elif k == "dl_np_write": self.state[st[1]][st[2]] += st[3]
        elif k == "dl_torch_write": self.state[st[1]][st[2]] *= st[3]
        elif k == "disk_save": self.files[st[1]] = self.state[st[1]].clone()
        elif k == "disk_open": self.opened[st[1]] = self.files[st[1]].clone()
        elif k == "disk_load": self.state[st[1]].copy_(self.opened[st[1]])
        elif k == "safe_roundtrip": pass
        elif k == "shard_add":
            p = self.state[st[1]]
            p += st[2]
            self.out.append((lab, p.numpy().copy()))
            p += st[3]
        elif k == "shard_eval":
            self.model.eval()
            self.out.append((lab, self.model(self.xy(st[1])[0]).numpy().copy()))
        elif k == "check": self.read_state(lab)
        else: raise ValueError(f"unknown step {k}")

    def finish(self) -> None:
        self.read_state("end")
        for lab, t in self.later: self.out.append((lab, t.numpy().copy()))


# ---------------------------------------------------------------------------------------------------------------------
# running and comparing

@dataclass
class Result:
    out: list[tuple[str, np.ndarray]]
    error: tuple[int, str, str] | None   # (step, exception type, first line of the message)


class Hang(Exception):
    """A run took longer than the time limit (FUZZ_TIMEOUT seconds, default 60): reported as a finding."""


def _alarm(signum: int, frame: Any) -> None:
    raise Hang(f"no result after {os.getenv('FUZZ_TIMEOUT', '60')} s")


def run_one(prog: Program, how: str) -> Result:
    """Run `prog` by "default", "reference" (fusegrad) or "torch"; an exception stops the run and is recorded, and so
    does a run past the time limit (in the main thread, by SIGALRM)."""
    init, batches = data(prog)
    tmp = tempfile.mkdtemp(prefix="fgfuzz")
    i = -1
    saved_training = Tensor.training
    try:
        with Context(REFERENCE=int(how == "reference")):
            r: Any = TorchRun(prog, init, batches, tmp) if how == "torch" else FGRun(prog, init, batches, tmp)
            timed = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
            if timed:
                old = signal.signal(signal.SIGALRM, _alarm)
                signal.alarm(int(os.getenv("FUZZ_TIMEOUT", "60")))
            try:
                for i, st in enumerate(prog.steps): r.step(i, st)
                i = len(prog.steps)
                r.finish()
            except Exception as e:   # noqa: BLE001 - any exception is a finding, recorded with where it happened
                msg = (str(e).strip().splitlines() or [""])[0][:200]
                if os.getenv("FUZZ_TRACEBACK"): traceback.print_exc()
                return Result(r.out, (i, type(e).__name__, msg))
            finally:
                if timed:
                    signal.alarm(0)
                    signal.signal(signal.SIGALRM, old)
            return Result(r.out, None)
    finally:
        Tensor.training = saved_training
        shutil.rmtree(tmp, ignore_errors=True)


def _close(a: np.ndarray, b: np.ndarray, tol: tuple[float, float]) -> bool:
    if a.shape != b.shape: return False
    if a.dtype.kind in "iub" or b.dtype.kind in "iub": return bool(np.array_equal(a, b))
    return bool(np.allclose(a, b, rtol=tol[0], atol=tol[1], equal_nan=True))


def first_mismatch(x: Result, y: Result, tol: tuple[float, float]) -> str | None:
    """The first output that differs (by label), or None. Outputs missing on one side (an error stopped it) are not
    compared: errors are reported separately."""
    ya = {lab: v for lab, v in y.out}
    assert len(ya) == len(y.out), "output labels must be unique"
    for lab, v in x.out:
        if lab in ya and not _close(v, ya[lab], tol):
            w = ya[lab]
            diff = float(np.max(np.abs(v.astype(np.float64) - w.astype(np.float64)))) if v.shape == w.shape else -1
            return f"{lab}: max abs diff {diff:.3g}"
    return None


def check(prog: Program) -> list[tuple[str, str]]:
    """Run the three ways and compare. Returns the findings as (signature, detail); empty when all agree."""
    res = {how: run_one(prog, how) for how in ("torch", "reference", "default")}
    found = []
    for how, r in res.items():
        if r.error is not None:
            found.append((f"{how} raises {r.error[1]}", f"step {r.error[0]}: {r.error[1]}: {r.error[2]}"))
    for a, b, tol in (("default", "reference", TIGHT), ("reference", "torch", LOOSE), ("default", "torch", LOOSE)):
        if (m := first_mismatch(res[a], res[b], tol)):
            found.append((f"{a} != {b} at {m.split(':')[0].split(' ', 2)[-1]}", m))
    return found


def reduce(prog: Program, signature: str, budget: int = 40) -> Program:
    """A shorter program with the same finding: drop one step at a time while the signature stays."""
    cur, tries = prog, 0
    changed = True
    while changed and tries < budget:
        changed = False
        for i in reversed(range(len(cur.steps))):
            if tries >= budget: break
            cand = replace(cur, steps=cur.steps[:i] + cur.steps[i + 1:])
            tries += 1
            if any(sig == signature for sig, _ in check(cand)):
                cur, changed = cand, True
    return cur


def select(prog: Program, keep: list[int] | None) -> Program:
    if keep is None: return prog
    return replace(prog, steps=[prog.steps[i] for i in keep])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100, help="how many programs")
    ap.add_argument("--seed", type=int, default=0, help="the first program's seed (then seed+1, ...)")
    ap.add_argument("--keep", type=str, default=None, help="only these steps of the program (comma-separated indices)")
    ap.add_argument("--show", action="store_true", help="print each program")
    ap.add_argument("--no-reduce", action="store_true", help="don't shrink failing programs")
    args = ap.parse_args(argv)
    keep = [int(x) for x in args.keep.split(",")] if args.keep else None
    st, failures, kinds = time.time(), 0, {}
    for n, seed in enumerate(range(args.seed, args.seed + args.n)):
        prog = select(generate(seed), keep)
        if args.show: print(render(prog))
        t0 = time.time()
        found = check(prog)
        if args.show: print(f"({time.time() - t0:.1f} s)", flush=True)
        if found:
            failures += 1
            sig = found[0][0]
            new = sig not in kinds
            for sg in dict.fromkeys(sg for sg, _ in found): kinds.setdefault(sg, []).append(seed)
            print(f"FAIL seed {seed}: " + "; ".join(f"[{s}] {d}" for s, d in found), flush=True)
            if new and not args.no_reduce and keep is None:
                small = reduce(prog, sig)
                idx: list[int] = []
                for s in small.steps:   # indices in the original program, in order
                    j = prog.steps.index(s, idx[-1] + 1 if idx else 0)
                    idx.append(j)
                print(f"  minimal program ({len(small.steps)} of {len(prog.steps)} steps): "
                      f"python test/fuzz/programs.py --n 1 --seed {seed} --keep {','.join(map(str, idx))} --show")
                print("  " + render(small).replace("\n", "\n  "), flush=True)
        if (n + 1) % 50 == 0 or n + 1 == args.n:
            print(f"{n + 1} programs, {failures} failing, {time.time() - st:.0f} s", flush=True)
    print("distinct findings (programs showing each):")
    for sig, seeds in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(seeds):5d}  {sig}  (seeds {', '.join(map(str, seeds[:8]))}{' ...' if len(seeds) > 8 else ''})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
