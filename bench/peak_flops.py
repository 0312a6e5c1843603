#!/usr/bin/env python3
"""The CPU's peak float32 GFLOPS, measured: the yardstick for a kernel's "% of peak" (docs/performance.md).

    python bench/peak_flops.py               # 1 thread, then every core
    python bench/peak_flops.py --threads 2
    CPU_MARCH=x86-64-v3 python bench/peak_flops.py   # the peak of AVX2 code (256-bit vectors) on any newer x86

A small C program (GCC vector extensions at the SIMD width of -march=$CPU_MARCH, default native, compiled like fusegrad's kernels but
with fused multiply-add allowed) runs 12 independent multiply-add chains per thread, more than the FMA latency times
the number of FMA pipes, so only the FMA throughput limits it. Each thread times 400 short bursts (~2 ms) and keeps
the fastest: a burst the scheduler didn't interrupt, so the number holds on a machine other jobs share.
Reported per thread; the machine's peak is the sum over its cores.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout without install
from fusegrad.runtime.machine import cpu_march
from fusegrad.runtime.ops_cpu import CPUCompiler, cpu_threads

CHAINS = 12
BURST = 200_000   # multiply-add steps per burst

SRC = """
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef float vf __attribute__((vector_size({vbytes})));
static double now(void) {{ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }}
static void *run(void *out) {{
  double best = 1e30; float keep = 0;
  for (int rep = 0; rep < 400; rep++) {{
    vf b = (vf){{}} + 1.0000001f, c = (vf){{}} + 1e-7f;
    vf {decls};
    double t0 = now();
    for (long it = 0; it < {burst}L; it++) {{ {body} }}
    double t = now() - t0;
    if (t < best) best = t;
    vf s = {sum};
    for (int i = 0; i < (int)(sizeof(vf) / sizeof(float)); i++) keep += s[i];
  }}
  ((double *)out)[0] = {flops}.0 / best * 1e-9; ((double *)out)[1] = keep;  /* keep: the chains are live */
  return 0;
}}
int main(int argc, char **argv) {{
  int n = atoi(argv[1]); pthread_t th[256]; double r[512];
  for (int i = 0; i < n; i++) pthread_create(&th[i], 0, run, &r[2 * i]);
  for (int i = 0; i < n; i++) pthread_join(th[i], 0);
  for (int i = 0; i < n; i++) printf("%.1f\\n", r[2 * i]);
  return 0;
}}
"""


def build(vbytes: int, d: str, march: str) -> str:
    """Compile the probe for vbytes-wide vectors in folder d; returns the binary's path."""
    lanes = vbytes // 4
    src = SRC.format(vbytes=vbytes, burst=BURST, flops=2 * lanes * CHAINS * BURST,
                     decls=", ".join(f"a{i} = (vf){{}} + (float)(rep + {i})" for i in range(CHAINS)),  # distinct: no CSE
                     body=" ".join(f"a{i} = a{i} * b + c;" for i in range(CHAINS)),
                     sum=" + ".join(f"a{i}" for i in range(CHAINS)))
    with open(os.path.join(d, "peak.c"), "w") as f: f.write(src)
    exe = os.path.join(d, "peak")
    subprocess.run(["gcc", "-O2", f"-march={march}", "-ffp-contract=fast", "-pthread", os.path.join(d, "peak.c"),
                    "-o", exe], check=True)
    return exe


def measure(exe: str, threads: int) -> list[float]:
    """GFLOPS of each of `threads` threads running the probe at once."""
    out = subprocess.run([exe, str(threads)], check=True, capture_output=True, text=True).stdout
    return [float(x) for x in out.split()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=cpu_threads(), help="threads for the all-core run (default: cores)")
    args = ap.parse_args()
    vbytes = max(CPUCompiler().machine.vector_bytes, 16)   # the CPU device's target (CPU_MARCH)
    with tempfile.TemporaryDirectory(prefix="fg_peak_") as d:
        exe = build(vbytes, d, cpu_march())
        one = measure(exe, 1)[0]
        many = measure(exe, args.threads)
    print(f"float32 FMA, -march={cpu_march()}, {vbytes * 8}-bit vectors, {CHAINS} chains; best of 400 bursts per thread")
    print(f"1 thread:  {one:.1f} GFLOPS")
    print(f"{args.threads} threads: {' + '.join(f'{g:.1f}' for g in many)} = {sum(many):.1f} GFLOPS")


if __name__ == "__main__":
    main()
