"""The README demo: a matmul written as broadcast-multiply-sum is lazy until realized, and runs as ONE fused kernel.

Run with DEBUG=2 to see the kernel, DEBUG=4 to see its generated C source.
"""
import numpy as np

from fusegrad import GlobalCounters, Tensor

N = 128
an, bn = np.random.rand(N, N).astype(np.float32), np.random.rand(N, N).astype(np.float32)
a, b = Tensor(an), Tensor(bn)                                   # data copied to the default device
c = (a.reshape(N, 1, N) * b.T.reshape(1, N, N)).sum(axis=2)   # nothing has run yet: c is a graph
GlobalCounters.reset()
result = c.numpy()                                              # realize: schedule -> codegen -> compile -> run
print(f"kernels run for c: {GlobalCounters.kernel_count}")
print(f"max abs error vs numpy: {np.abs(result - an @ bn).max():.2e}")
assert GlobalCounters.kernel_count == 1, "the matmul should be one fused kernel"
assert np.allclose(result, an @ bn, atol=1e-4), "mismatch against numpy"
print("ok: one kernel, matches numpy")
