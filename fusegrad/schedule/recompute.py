"""When fusing recomputes too much: the cost model that turns an expensive fused subgraph into a realize point.

A node fused into its consumers is recomputed wherever it is used: by several kernels, or many times inside one
kernel's loops (an LSTM's gate gradients inside the weight-gradient matmuls, a GELU inside a matmul's reduce loop).
Giving it a buffer trades that recomputation for one more kernel, a store of each element and a load per use. In units
of ALU ops, a node of `cost` ops per element (its fused subgraph, see `node_cost`) that the schedule evaluates `evals`
times is realized when

    cost >= EXPENSIVE_OPS  and  cost * (evals - size) > KERNEL_OPS + MEMORY_OPS * (size + evals)

The first condition keeps cheap prologues (a scale, a cast, a masked load) fused however often they run, so a matmul of
`x * 2` stays one kernel; the second asks that the work saved pays for the extra kernel. Softmax's `exp(x - max)` (about
8 ops, evaluated twice per element) therefore stays fused at any size.

A node that a reduce re-reads (`evals >= REUSE * size`, REUSE 2: a conv's or matmul's input) is judged with a lower
bar, `cost >= REUSED_OPS` and `cost * (evals - size) > KERNEL_OPS + 2 * MEMORY_OPS * size`: fused, its ops run inside
the reduce's innermost loop for every reuse, while each of those evaluations would load an element either way, so
realizing costs only one store and load per element. Measured on the CPU at batch 512: beautiful_mnist's second conv
with the first's `(x + bias).relu()` fused into its input ran 116 ms, with that input realized 58 ms (both kernels);
`(x * 2 + 1).relu() @ w` at 1024: 46 ms fused, 18 ms as two kernels. The bar was 16 re-reads until EfficientNet-Lite0's
depthwise convs (each input element read 9 times by a 3x3 window, 2.25 times by a 3x3 window of stride 2) showed the
previous layer's batch norm and ReLU6 recomputed in the window loop: 3.4x the time of the conv alone (batch 1, 1.49
vs 0.41 ms for the stride-2 3x3 one). Softmax's `exp(x - max)`, evaluated twice, is not above it: 8 ops do not pay
for a kernel and a round trip (the second condition). Nor is a node more than BROADCAST times bigger than everything
it reads (buffers, realize points, reduces' outputs): that is a broadcast, such as a conv's unfold times its weight
before the sum, and storing it writes out every copy (beautiful_mnist's train step stored a 943M-element product
when the bar first went down to 2).

Pass-through nodes (DETACH, CONTIGUOUS) are not counted (indexing.py): a conv's input is `x.pad(...).detach()`, and
realizing the DETACH would store the padded tensor, the producer kernel then computing its border of zeros with masked
loads (1x1 convs on 7x7 maps padded to 11x11 ran 4x slower). The node under the PAD is realized instead, and the
conv reads it with masked loads (codegen/vectorize.py).

`evals` comes from index propagation (indexing.py): the linearizer emits a node in the loop of the deepest RANGE its
index depends on, so its number of evaluations is the trip count of that loop chain.
"""
from __future__ import annotations

from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.ir.shape import smax

EXPENSIVE_OPS = 16
KERNEL_OPS = 1 << 18   # an extra kernel (launch, Python overhead, scheduling) is worth this many ALU ops
MEMORY_OPS = 4         # storing or loading one element
REUSE = 2              # a node evaluated this many times per element (by a reduce that re-reads it: a conv's input) ...
REUSED_OPS = 2         # ... is realized from this many ops: (x + bias).relu() before a conv, not x * 2 before a matmul
BROADCAST = 4          # ... unless it is this many times bigger than any tensor it reads (a broadcast product)
OP_COST = {Ops.EXP2: 4, Ops.LOG2: 4, Ops.SIN: 4, Ops.SQRT: 4, Ops.RECIPROCAL: 4, Ops.IDIV: 4, Ops.MOD: 4,
           Ops.GATHER: 2, Ops.PAD: 1, Ops.CAST: 1, Ops.BITCAST: 1, Ops.REDUCE_AXIS: 1}
FREE = (Ops.BUFFER, Ops.CONST)


def node_cost(n: UOp, rp: set[UOp], limit: int) -> tuple[int, bool, set[UOp]]:
    """Weighted ALU ops per element of the subgraph fused under `n`, counted up to `limit`; whether the count is
    complete; and the nodes it looked at. Loads (realize points, buffers), constants and movement ops are free; a fused
    reduce counts as one op (it runs at its own loop level, its recomputation is judged on its own)."""
    cost, seen, stack = 0, {n}, [n]
    while stack and cost < limit:
        x = stack.pop()
        if x is not n and x in rp: continue
        cost += OP_COST.get(x.op, 1 if x.op in GroupOp.ALU else 0)
        if x.op is Ops.REDUCE_AXIS: continue
        for s in x.src:
            if s not in seen and s.op not in FREE:
                seen.add(s)
                stack.append(s)
    return cost, not stack, seen


class RecomputePolicy:
    """Decides whether a fused node evaluated `evals` times is worth a buffer. Counted costs are cached across the
    scheduler's rounds; a count stays valid until a new realize point lands in the subgraph it looked at."""

    def __init__(self, rp: set[UOp]):
        self.rp = rp
        self.added: list[UOp] = []   # realize points added since the start, in order (see `realize`)
        self.costs: dict[UOp, tuple[int, bool, set[UOp], int]] = {}  # node -> (cost, complete, looked at, len(added))
        self.broadcasts: dict[UOp, bool] = {}   # node -> bigger than what it reads (see _broadcast)

    def realize(self, new: set[UOp]) -> None:
        self.rp.update(new)
        self.added.extend(new)

    def _broadcast(self, n: UOp, size: int) -> bool:
        """Whether n is bigger than BROADCAST times everything it reads (an unfold times a weight, before the sum):
        storing it would write out a broadcast, never cheaper than recomputing it from its small inputs (a train
        step's pool backward stored beautiful_mnist's 943M-element conv product: 1 s and 3.8 GB)."""
        if (b := self.broadcasts.get(n)) is None:
            # what n reads: buffers, realize points, and reduces (a fused reduce is read as its output)
            def leaf(u: UOp) -> bool: return u in self.rp or u.op in (Ops.BUFFER, Ops.REDUCE_AXIS)
            leaves = [x for x in n.toposort(gate=lambda u: u is n or not leaf(u)) if x is not n and leaf(x)]
            b = self.broadcasts[n] = size > BROADCAST * max((smax(x.size) for x in leaves), default=1)
        return b

    def worth_realizing(self, n: UOp, evals: int) -> bool:
        size = smax(n.size)   # symbolic: judged at the largest size
        if evals < 2 * size or n.device is None: return False
        if n.op is Ops.REDUCE_AXIS: return True    # a reduce is never cheap to run twice
        if n.op in GroupOp.Movement or n.op in FREE: return False
        extra = evals - size
        need = max(EXPENSIVE_OPS, (KERNEL_OPS + MEMORY_OPS * (size + evals)) // extra + 1)
        reread = max(REUSED_OPS, (KERNEL_OPS + 2 * MEMORY_OPS * size) // extra + 1)
        if evals >= REUSE * size and reread < need and not self._broadcast(n, size):
            need = reread   # re-read (a conv's input): each eval then loads the buffer instead
        if (c := self.costs.get(n)) is not None:
            cost, complete, seen, mark = c
            if complete and cost < need: return False   # realize points only lower a cost
            if mark == len(self.added) or not any(r in seen for r in self.added[mark:]):
                self.costs[n] = (cost, complete, seen, len(self.added))
                if complete or cost >= need: return cost >= need
        cost, complete, seen = node_cost(n, self.rp, need)
        self.costs[n] = (cost, complete, seen, len(self.added))
        return cost >= need
