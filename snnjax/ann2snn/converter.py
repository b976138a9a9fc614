"""``Converter``: a trained ReLU ``Sequential`` into an IF-neuron SNN, as SpikingJelly's rate-coding converter does it.

Three steps (``Converter.convert`` runs them on a copy of the ANN, which is left as it was):

1. fold (``fuse_flag``): each BatchNorm directly after a convolution is folded into it with its running statistics,
   ``kernel * gamma / sqrt(var + eps)`` and ``(bias - mean) * gamma / sqrt(var + eps) + beta``; every other BatchNorm
   stays and runs in eval mode;
2. calibrate: the folded ANN (eval mode) runs on each batch of ``dataloader``; the statistic of each ReLU's output
   ``a`` over the whole batch is ``s = max(a)`` (``mode="max"``, any case), its ``q``-th percentile (``"99.9%"``,
   linear interpolation) or ``r * max(a)`` (a number ``0 < r <= 1``); the first batch's ``s`` starts the scale and
   each later one moves it, ``scale = (1 - momentum) * scale + momentum * s``;
3. replace: each ReLU becomes ``VoltageScaler(1 / scale)``, ``IFNode(v_reset=None)`` (threshold 1, soft reset),
   ``VoltageScaler(scale)``: the neuron fires at the rate ``relu(x) / scale`` (at most 1) and the second scaler
   restores the ANN's range. Every other layer (pooling, flatten, linear, convolution) is kept as it is.

The SNN is a ``Sequential`` in eval mode on ``[T, N, ...]``: the same static input at every step, its output at
step ``t`` the network's output for that step (SpikingJelly's evaluation sums them: ``out.cumsum(0)[t]`` is its
output after ``t + 1`` steps). A ``Converter`` takes ``snnjax.Sequential`` ANNs of ``nnx.Conv`` / ``nnx.Linear``,
``layers.BatchNorm``, ``layers.ReLU``, ``layers.AvgPool2d`` / ``layers.MaxPool2d``, ``layers.Flatten`` and dropout.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from snnjax.layers import AvgPool2d, BatchNorm, Flatten, MaxPool2d, ReLU
from snnjax.models.sequential import Sequential
from snnjax.neurons import IFNode

SUPPORTED = (nnx.Conv, nnx.Linear, BatchNorm, ReLU, AvgPool2d, MaxPool2d, Flatten, nnx.Dropout)


class VoltageScale(nnx.Variable):
    """The fixed factor of a ``VoltageScaler`` (state, not a trained parameter)."""


class VoltageScaler(nnx.Module):
    """``x * scale``, ``scale`` fixed at conversion: the current scaling around each converted neuron.

    ``scale`` is a ``VoltageScale`` variable (an array in the default float dtype), so that SNNs converted with other
    scales share one compiled program.
    """

    def __init__(self, scale: float):
        self.scale = VoltageScale(jnp.asarray(scale, dtype=float))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x * self.scale[...].astype(x.dtype)


class Converter:
    """Converts a ReLU ``Sequential`` into an IF-neuron ``Sequential`` (the module docstring gives the steps).

    ``dataloader``: the calibration batches, each an array of ANN inputs without the time axis, ``[N, ...]``
    (``[N, H, W, C]`` for images), or a tuple / list whose first item is one (``(images, labels)``), or a dict with
    it under ``"inputs"``. ``mode``: ``"max"`` (default ``"Max"``; any case), a percentile ``"P%"`` with
    ``0 <= P <= 100`` (``"99.9%"``), or a number ``0 < r <= 1`` (``r`` times the maximum). ``momentum``: in
    ``[0, 1]``, the weight of each later batch's statistic. ``fuse_flag``: fold each convolution's BatchNorm into it.
    """

    def __init__(self, dataloader: Iterable[Any], mode: str | float = "Max", momentum: float = 0.1,
                 fuse_flag: bool = True):
        self.statistic = _statistic_spec(mode)
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0.0 <= momentum <= 1.0:
            raise ValueError(f"Converter(momentum=...) must be a number in [0, 1], got {momentum!r}")
        if not isinstance(fuse_flag, bool):
            raise ValueError(f"Converter(fuse_flag=...) must be True or False, got {fuse_flag!r}")
        self.dataloader, self.mode, self.momentum, self.fuse_flag = dataloader, mode, float(momentum), fuse_flag

    def convert(self, ann: Sequential) -> Sequential:
        """The SNN for ``ann`` (a ``snnjax.Sequential``; left unchanged), calibrated on ``dataloader``."""
        folded = self.fold(ann)
        scales = self.calibrate(folded)
        layers, k = [], 0
        for layer in folded.layers:
            if isinstance(layer, ReLU):
                layers += [VoltageScaler(1.0 / scales[k]), IFNode(v_reset=None, step_mode="m"),
                           VoltageScaler(scales[k])]
                k += 1
            else:
                layers.append(layer)
        snn = Sequential(*layers)
        snn.eval()
        return snn

    def fold(self, ann: Sequential) -> Sequential:
        """A copy of ``ann`` in eval mode, each BatchNorm after a convolution folded into it if ``fuse_flag``."""
        if not isinstance(ann, Sequential):
            raise TypeError(f"Converter.convert(ann=...) takes a snnjax.Sequential, got {type(ann).__name__}")
        for i, layer in enumerate(ann.layers):
            if not isinstance(layer, SUPPORTED):
                raise ValueError(f"Converter: ann.layers[{i}] is a {type(layer).__name__}; the converter takes "
                                 f"{', '.join(t.__name__ for t in SUPPORTED)}")
        source = nnx.clone(ann)
        layers, i = [], 0
        while i < len(source.layers):
            layer = source.layers[i]
            after = source.layers[i + 1] if i + 1 < len(source.layers) else None
            if self.fuse_flag and isinstance(layer, nnx.Conv) and isinstance(after, BatchNorm):
                layers.append(fold_batchnorm(layer, after))
                i += 2
            else:
                layers.append(layer)
                i += 1
        folded = Sequential(*layers)
        folded.eval()
        return folded

    def calibrate(self, folded: Sequential) -> list[float]:
        """The scale of each ReLU of ``folded`` (in order) over ``dataloader`` (see the module docstring)."""
        scales = None
        for b, batch in enumerate(self.dataloader):
            s = _relu_statistics(folded, _batch_inputs(batch, b), self.statistic)
            m = self.momentum
            scales = s if scales is None else [(1 - m) * a + m * c for a, c in zip(scales, s, strict=True)]
        if scales is None:
            raise ValueError("Converter(dataloader=...) yielded no batch: calibration needs at least one")
        out = [float(s) for s in scales]
        for k, s in enumerate(out):
            if not (s > 0.0 and math.isfinite(s)):
                raise ValueError(f"Converter: the statistic of ReLU {k} is {s} over the calibration data (a ReLU that "
                                 f"never activates): a positive scale is needed; check the ANN or its data, or "
                                 f"choose another mode (now {self.mode!r})")
        return out


def fold_batchnorm(conv: nnx.Conv, bn: BatchNorm) -> nnx.Conv:
    """A copy of ``conv`` followed by ``bn`` (eval mode: running statistics) as one convolution with a bias."""
    # numpy in the parameters' dtype: the same arithmetic as on device, without compiling a program per shape
    kernel = np.asarray(conv.kernel[...])
    gamma, beta, mean, var = (np.asarray(v[...]) for v in (bn.scale, bn.bias, bn.mean, bn.var))
    bias = np.asarray(conv.bias[...]) if conv.bias is not None else np.zeros_like(mean)
    rsqrt = 1 / np.sqrt(var + np.asarray(bn.eps, var.dtype))
    fused = nnx.clone(conv)
    fused.kernel = nnx.Param(jnp.asarray((kernel * (gamma * rsqrt)).astype(kernel.dtype)))
    fused.bias = nnx.Param(jnp.asarray(((bias - mean) * rsqrt * gamma + beta).astype(kernel.dtype)))
    fused.use_bias = True
    return fused


def _statistic_spec(mode: str | float) -> tuple[str, float]:
    """``mode`` as ``("max", r)`` (``r`` times the maximum) or ``("quantile", q)``; a clear error for any other."""
    bad = (f"Converter(mode=...) must be 'max', a percentile such as '99.9%' (0 to 100), or a number r with "
           f"0 < r <= 1 (r times the maximum); got {mode!r}")
    if isinstance(mode, str):
        if mode.lower() == "max":
            return ("max", 1.0)
        if mode.endswith("%"):
            try:
                q = float(mode[:-1]) / 100.0
            except ValueError:
                raise ValueError(bad) from None
            if 0.0 <= q <= 1.0:
                return ("quantile", q)
        raise ValueError(bad)
    if isinstance(mode, (int, float)) and not isinstance(mode, bool) and 0 < mode <= 1:
        return ("ratio", float(mode))
    raise ValueError(bad)


@nnx.jit(static_argnums=2)
def _relu_statistics(model: Sequential, x: jax.Array, spec: tuple[str, float]) -> list[jax.Array]:
    """The statistic (``spec``) of each ReLU's output when ``model`` runs on ``x [N, ...]`` (one time step)."""
    kind, p = spec
    out, h = [], x[None]
    for layer in model.layers:
        h = layer(h)
        if isinstance(layer, ReLU):
            out.append(jnp.quantile(h, p) if kind == "quantile" else jnp.max(h) * p if kind == "ratio" else jnp.max(h))
    return out


def _batch_inputs(batch: Any, b: int) -> jax.Array:
    """The ANN inputs of calibration batch ``b``: the array itself, a tuple's first item, or a dict's ``inputs``."""
    if isinstance(batch, (tuple, list)) and batch:
        batch = batch[0]
    elif isinstance(batch, dict):
        if "inputs" not in batch:
            raise ValueError(f"Converter(dataloader=...): batch {b} is a dict without 'inputs' (keys {sorted(batch)})")
        batch = batch["inputs"]
    if not isinstance(batch, (np.ndarray, jax.Array)):
        raise ValueError(f"Converter(dataloader=...): batch {b} is a {type(batch).__name__}; each batch is an array "
                         "[N, ...], a tuple whose first item is one, or a dict with 'inputs'")
    return jnp.asarray(batch)
