"""Where a fresh process's first beautiful_mnist training step spends its time (the `first train step` rows of
bench/run.py, broken down).

    python bench/first_profile.py                    # cold (empty kernel cache) then warm, device-sampled batch
    python bench/first_profile.py --fixed            # the fixed batch instead
    python bench/first_profile.py --runs 3           # three cold/warm pairs
    python bench/first_profile.py --flags "-O1 ..."  # other C compiler flags (replace CPUCompiler.flags)
    python bench/first_profile.py --root ../main     # profile another checkout of fusegrad (A/B comparisons)

Each run is a new process with its own cache directory (XDG_CACHE_HOME), timing: the import of fusegrad, the model's
initialization (its small realizes), and the step's one realize; the CPU time of the process and of its compiler
processes; how many compiler runs there were, their summed wall time and source size; and codegen (rendering kernel
ASTs to C, `_get_spec`) in wall and in the calling thread's CPU time. The machine's load average is printed with
every run: on a shared machine only the CPU times compare between runs.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _procs

PROFILE = """
import json, os, resource, sys, time
st = time.perf_counter()
sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r})
import numpy as np
import fusegrad.engine.realize as er
from fusegrad.runtime.ops_cpu import CPUCompiler
if {flags!r}: CPUCompiler.flags = {flags!r}.split()
t_import = time.perf_counter() - st
comp, gen = [], []
real_compile, real_spec = CPUCompiler.compile, er._get_spec
def compile(self, src):
    t = time.perf_counter(); out = real_compile(self, src); comp.append((time.perf_counter() - t, len(src))); return out
def get_spec(*args):
    t, c = time.perf_counter(), time.thread_time(); out = real_spec(*args)
    gen.append((time.perf_counter() - t, time.thread_time() - c)); return out
CPUCompiler.compile, er._get_spec = compile, get_spec
from run import FgModel
from fusegrad import Tensor, nn
from fusegrad.nn.optim import Adam
model = FgModel(); opt = Adam(nn.state.get_parameters(model))
X = Tensor(np.random.rand({n}, 1, 28, 28).astype(np.float32)); Y = Tensor(np.random.randint(0, 10, {n}))
t_init = time.perf_counter() - st - t_import
runs_init = len(comp)
with Tensor.train():
    opt.zero_grad()
    idx = Tensor.randint({bs}, high={n}) if {sampled} else None
    x, y = (X[idx], Y[idx]) if {sampled} else (X, Y)
    loss = model(x).sparse_categorical_crossentropy(y).backward()
    loss.realize(*opt.schedule_step()).item()
wall = time.perf_counter() - st
ch = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps(dict(wall=wall, imp=t_import, init=t_init, step=wall - t_import - t_init, cpu=time.process_time(),
                      cc_cpu=ch.ru_utime + ch.ru_stime, cc_runs=len(comp), cc_runs_init=runs_init,
                      cc_wall=sum(c[0] for c in comp), cc_chars=sum(c[1] for c in comp), gen=len(gen),
                      gen_wall=sum(g[0] for g in gen), gen_cpu=sum(g[1] for g in gen))))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixed", action="store_true", help="a fixed batch instead of one sampled on the device")
    ap.add_argument("--runs", type=int, default=1, help="cold/warm pairs")
    ap.add_argument("--bs", type=int, default=512)
    ap.add_argument("--flags", default="", help="C compiler flags replacing CPUCompiler.flags")
    ap.add_argument("--root", default=os.path.dirname(HERE), help="the fusegrad checkout to import")
    a = ap.parse_args()
    code = PROFILE.format(root=os.path.abspath(a.root), bench=HERE, n=a.bs if a.fixed else 4096, bs=a.bs,
                          sampled=not a.fixed, flags=a.flags)
    print(f"first train step bs{a.bs}, {'fixed' if a.fixed else 'device-sampled'} batch" +
          (f", flags {a.flags}" if a.flags else ""))
    for _ in range(a.runs):
        with tempfile.TemporaryDirectory() as cache:
            for label in ("cold", "warm"):
                load = os.getloadavg()[0]
                r = _procs.spawn(["-c", code], {"XDG_CACHE_HOME": cache}, timeout=1800)
                print(f"{label}: {r['wall']:.2f} s wall (import {r['imp']:.2f}, init {r['init']:.2f}, step "
                      f"{r['step']:.2f}); CPU {r['cpu']:.2f} s + compilers {r['cc_cpu']:.2f} s; "
                      f"{r['cc_runs']} compiler runs ({r['cc_runs_init']} in init, {r['cc_chars'] / 1e3:.0f}K chars, "
                      f"{r['cc_wall']:.2f} s summed wall); codegen of {r['gen']} kernels {r['gen_wall']:.2f} s wall, "
                      f"{r['gen_cpu']:.2f} s CPU; load {load:.2f}")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
