"""Data-parallel MNIST over MPI: every rank trains the same model on its shard of every global batch.

  mpirun --allow-run-as-root --oversubscribe -n 2 python examples/mnist_dist.py     # 2 ranks, 64 images each
  python examples/mnist_dist.py                                                     # 1 process, the same run

All ranks draw the same global batch of BS indices (a NumPy generator seeded with SEED); rank r takes the r-th slice of
it. Gradients are averaged by `fusegrad.distributed.DataParallel`, the printed loss is the average of the ranks'
losses, so with equal shards both are those of the single-process run on the whole batch: the loss curves agree to
float rounding (the sums are grouped differently). The model is beautiful_mnist's convnet without its BatchNorm
layers: BatchNorm normalizes with the statistics of the batch it sees, and a rank sees only its shard, so per-rank
BatchNorm would train a different model (synchronizing the statistics would need an allreduce inside the forward).

Env vars: STEPS (default 20), BS (global batch, default 128, divisible by the number of ranks), LR (Adam, default
0.001), SEED (default 0), MODEL=mlp (a 784-128-10 MLP, fast; the tests use it), LOSS_FILE (rank 0 writes the losses
there as JSON), BUCKET_MB (gradient bucket cap, default 25), JIT=1 (TinyJit the gradient computation and the update,
with the allreduce between them on the host: faster, but the allreduce no longer overlaps the backward pass),
FUSEGRAD_DIST_TIMEOUT (seconds a collective may wait, default 300).
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import numpy as np

from fusegrad import Tensor, TinyJit, getenv, nn
from fusegrad import distributed as dist
from fusegrad.nn.datasets import mnist


class ConvNet:
    """beautiful_mnist's model without BatchNorm (see the module docstring)."""

    def __init__(self) -> None:
        self.layers: list[Callable[[Tensor], Tensor]] = [
            nn.Conv2d(1, 32, 5), Tensor.relu, nn.Conv2d(32, 32, 5), Tensor.relu, Tensor.max_pool2d,
            nn.Conv2d(32, 64, 3), Tensor.relu, nn.Conv2d(64, 64, 3), Tensor.relu, Tensor.max_pool2d,
            lambda x: x.flatten(1), nn.Linear(576, 10)]

    def __call__(self, x: Tensor) -> Tensor: return x.sequential(self.layers)   # (B, 1, 28, 28) -> (B, 10)


class MLP:
    def __init__(self) -> None:
        self.layers: list[Callable[[Tensor], Tensor]] = [
            lambda x: x.flatten(1), nn.Linear(784, 128), Tensor.relu, nn.Linear(128, 10)]

    def __call__(self, x: Tensor) -> Tensor: return x.sequential(self.layers)


def jit_dp_step(model: Callable[[Tensor], Tensor], opt: nn.optim.Optimizer, params: list[Tensor],
                dp: dist.DataParallel) -> Callable[[Tensor, Tensor], Tensor]:
    """A data-parallel training step (images, labels) -> loss under TinyJit: two captured halves around the host
    allreduce (which can't be captured), the loss and gradients, then the update with the averaged gradients."""
    @TinyJit
    def grad_step(x: Tensor, y: Tensor) -> list[Tensor]:
        with Tensor.train():
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y).backward()
            grads = [p.grad if p.grad is not None else p.zeros_like() for p in params]
            return [loss.realize(*grads), *grads]

    @TinyJit
    def update_step(*grads: Tensor) -> None:
        with Tensor.train():
            for p, g in zip(params, grads): p.grad = g
            Tensor.realize(*opt.schedule_step())

    def step(x: Tensor, y: Tensor) -> Tensor:
        loss, *grads = grad_step(x, y)
        update_step(*dp.average(grads))
        return loss
    return step


def train(steps: int, bs: int, lr: float, seed: int, model_name: str, bucket_mb: float, jit: bool = False) \
        -> tuple[list[float], float]:
    """Train; returns (the global loss per step, the seconds per step after the first two, or three with `jit`)."""
    dist.init()
    rank, world = dist.rank(), dist.world_size()
    if bs % world: raise ValueError(f"BS={bs} is not divisible by the {world} ranks")
    local = bs // world
    Tensor.manual_seed(seed + 1000 * rank)   # different on purpose: the broadcast must make the params equal
    X_train, Y_train, _, _ = mnist()
    X, Y = X_train.numpy(), Y_train.numpy()
    model = ConvNet() if model_name == "conv" else MLP()
    params = nn.state.get_parameters(model)
    dp = dist.DataParallel(params, bucket_mb=bucket_mb)     # rank 0's initial weights everywhere
    opt = nn.optim.Adam(params, lr=lr)

    def eager_step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y).backward()
            dp.sync_grads(loss)                      # the loss and the gradients in one realize, then the allreduce
            opt.step()
        return loss

    step_fn = jit_dp_step(model, opt, params, dp) if jit else eager_step
    rng = np.random.default_rng(seed)
    losses, times = [], []
    for step in range(steps):
        st = time.perf_counter()
        idx = rng.integers(0, X.shape[0], bs)[rank * local:(rank + 1) * local]   # this rank's shard of the batch
        x = Tensor((X[idx].astype(np.float32) / 255.0 - 0.1307) / 0.3081)
        y = Tensor(Y[idx].astype(np.int32))
        loss = step_fn(x, y)
        losses.append(dist.allreduce(loss, "mean").item() if world > 1 else loss.item())
        times.append(time.perf_counter() - st)
        if rank == 0: print(f"step {step:4d} loss {losses[-1]:.6f} {times[-1] * 1000:7.1f} ms", flush=True)
    steady = times[3 if jit else 2:] or times
    return losses, sum(steady) / len(steady)


def main() -> int:
    losses, step_s = train(getenv("STEPS", 20), getenv("BS", 128), getenv("LR", 0.001), getenv("SEED", 0),
                           getenv("MODEL", "conv"), getenv("BUCKET_MB", 25.0), bool(getenv("JIT", 0)))
    if dist.rank() == 0:
        print(f"{dist.world_size()} rank(s): {step_s * 1000:.1f} ms/step, final loss {losses[-1]:.4f}")
        if (path := getenv("LOSS_FILE", "")):
            with open(path, "w") as f: json.dump(losses, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
