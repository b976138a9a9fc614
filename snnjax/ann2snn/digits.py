"""The digits conversion recipe: train a ReLU CNN on the embedded 8x8 digits, convert it, compare accuracies.

    python -m snnjax.ann2snn.digits                      # the table in docs/ann2snn.md
    python -m snnjax.ann2snn.digits --epochs 2 --width 4 # a quick look

The ANN is ``conv 3x3 (w) - BN - ReLU, conv (2w) - BN - ReLU, avgpool 2, conv (2w) - BN - ReLU, avgpool 2, flatten,
linear 10`` on ``[1, N, 8, 8, 1]`` (``snnjax.trainer``, Adam, one device). ``Converter`` calibrates it on the train
split and the SNN runs the test split for ``T`` steps, the image as the input current at every step; its prediction
after ``t`` steps is the argmax of the summed outputs of the first ``t``.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from snnjax.ann2snn.converter import Converter
from snnjax.data import digits_source, direct_encode
from snnjax.layers import AvgPool2d, BatchNorm, Flatten, ReLU, conv2d, linear
from snnjax.models.sequential import Sequential
from snnjax.train.model_trainer import trainer

TIME_STEPS = (8, 16, 32, 64)
MODES = ("max", "99.9%")


def relu_cnn(width: int, *, rngs: nnx.Rngs) -> Sequential:
    """The recipe's ANN for ``[T, N, 8, 8, 1]`` inputs (logits ``[T, N, 10]``), ``width`` channels in the first conv."""
    w = width
    return Sequential(
        conv2d(1, w, 3, padding=1, rngs=rngs), BatchNorm(w), ReLU(),
        conv2d(w, 2 * w, 3, padding=1, rngs=rngs), BatchNorm(2 * w), ReLU(), AvgPool2d(2),
        conv2d(2 * w, 2 * w, 3, padding=1, rngs=rngs), BatchNorm(2 * w), ReLU(), AvgPool2d(2),
        Flatten(), linear(2 * w * 2 * 2, 10, rngs=rngs))


def batches(images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int) -> list[dict[str, np.ndarray]]:
    """One shuffled epoch of ``{"inputs": [B, 8, 8, 1], "labels": [B]}`` (the last partial batch dropped)."""
    order = np.random.default_rng(seed).permutation(len(labels))
    return [{"inputs": images[order[i:i + batch_size]], "labels": labels[order[i:i + batch_size]]}
            for i in range(0, len(order) - batch_size + 1, batch_size)]


@nnx.jit
def _logits(net: Sequential, x: jax.Array) -> jax.Array:
    return net(x)


def accuracy_by_step(net: Sequential, images: np.ndarray, labels: np.ndarray, time_steps: int) -> np.ndarray:
    """``[time_steps]``: the accuracy of ``net`` after each step on ``images`` (the summed outputs' argmax)."""
    out = _logits(net, direct_encode(jnp.asarray(images), time_steps))
    return np.asarray(jnp.mean(jnp.argmax(jnp.cumsum(out, axis=0), axis=-1) == jnp.asarray(labels), axis=-1))


def train_ann(*, width: int = 16, epochs: int = 20, batch_size: int = 64, learning_rate: float = 3e-3,
              seed: int = 0) -> Sequential:
    """The recipe's ANN trained on the digits' train split (eval mode)."""
    train_x, train_y = split_arrays("train")
    fit = trainer(relu_cnn(width, rngs=nnx.Rngs(seed)), "data=1", optax.adam(learning_rate),
                  devices=jax.devices()[:1], encoder="direct", time_steps=1, seed=seed, verbose=False)
    for epoch in range(epochs):
        fit.fit(batches(train_x, train_y, batch_size, seed + epoch), progress=False)
    ann = fit.model()
    ann.eval()
    return ann


def evaluate(ann: Sequential, calibration: Sequence[np.ndarray], images: np.ndarray, labels: np.ndarray, *,
             modes: Sequence[str | float] = MODES, time_steps: Sequence[int] = TIME_STEPS) -> dict:
    """``ann`` converted in each of ``modes`` (calibrated on ``calibration``, batches ``[B, ...]``) and evaluated on
    ``images`` ``[N, ...]``: ``{"ann": accuracy, mode: {T: accuracy after T steps}}``."""
    results = {"ann": float(accuracy_by_step(ann, images, labels, 1)[0])}
    for mode in modes:
        snn = Converter(dataloader=calibration, mode=mode).convert(ann)
        by_step = accuracy_by_step(snn, images, labels, max(time_steps))
        results[mode] = {t: float(by_step[t - 1]) for t in time_steps}
    return results


def run(*, width: int = 16, epochs: int = 20, seed: int = 0, calibration_batches: int = 8) -> dict:
    """Train (``train_ann``), then ``evaluate`` on the test split, calibrated on ``calibration_batches`` of 64
    training images."""
    ann = train_ann(width=width, epochs=epochs, seed=seed)
    train_x, train_y = split_arrays("train")
    calibration = [b["inputs"] for b in batches(train_x, train_y, 64, seed)[:calibration_batches]]
    return evaluate(ann, calibration, *split_arrays("test"))


def split_arrays(split: str) -> tuple[np.ndarray, np.ndarray]:
    """The digits' ``split`` (``snnjax.data.digits_source``) as arrays: images ``[n, 8, 8, 1]``, labels ``[n]``."""
    source = digits_source(split)
    return source.read(np.arange(len(source)))


def table(results: dict) -> str:
    """``evaluate``'s results as markdown: the ANN's accuracy, then a row per T and a column per mode."""
    modes = [m for m in results if m != "ann"]
    lines = [f"ANN: {100 * results['ann']:.2f}%", "", "| T | " + " | ".join(f"SNN, mode={m!r}" for m in modes) + " |",
             "|---" * (len(modes) + 1) + "|"]
    lines += [f"| {t} | " + " | ".join(f"{100 * results[m][t]:.2f}%" for m in modes) + " |" for t in results[modes[0]]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m snnjax.ann2snn.digits", description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=16, help="channels of the first convolution")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(table(run(width=args.width, epochs=args.epochs, seed=args.seed)))


if __name__ == "__main__":
    main()
