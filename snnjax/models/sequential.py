"""``Sequential``: a model written as a list of layers, as SpikingJelly users write ``nn.Sequential``.

    net = Sequential(
        layers.conv2d(2, 16, 3, padding=1, rngs=rngs), layers.BatchNorm(16), LIFNode(step_mode="m"),
        layers.MaxPool2d(2),
        layers.conv2d(16, 32, 3, padding=1, rngs=rngs), layers.BatchNorm(32), LIFNode(step_mode="m"),
        layers.Flatten(), layers.linear(32 * 8 * 8, 10, rngs=rngs),
    )
    logits = net(x)          # x [T, N, H, W, C] -> logits [T, N, 10]

Every layer takes and returns time-major tensors (``[T, N, ...]``). The chain of units that
pipeline stages and activation checkpointing cut at (``units()``, ``snnjax.models.units``) is
made from the layers: a unit ends after each spiking neuron, and whatever follows the last
neuron (a classifier head) is one more unit. Layer ``i`` is ``net.layers[i]``; its variables'
paths start ``layers.i`` (and its SpikingJelly ``nn.Sequential`` key prefix is ``i.``, which
``snnjax.interop.layers`` uses to import such a model's weights).
"""
from __future__ import annotations

import jax
from flax import nnx

from snnjax.layers import Flatten, MaxPool2d
from snnjax.models import remat
from snnjax.models.units import Unit, run_units
from snnjax.neurons.modules import BaseNode

_KEEPS_SPIKES = (Flatten, MaxPool2d)  # layers whose output is binary when their input is


class Sequential(nnx.Module):
    """``layers`` applied in order to ``x [T, N, ...]``; each layer an ``nnx.Module`` taking one array."""

    def __init__(self, *layers: nnx.Module):
        if not layers:
            raise ValueError("Sequential needs at least one layer")
        for i, layer in enumerate(layers):
            if not isinstance(layer, nnx.Module):
                raise TypeError(f"Sequential: layer {i} is a {type(layer).__name__}, not an nnx.Module; wrap a "
                                "function in a module (e.g. snnjax.layers.Flatten() for a flatten)")
        self.layers = nnx.List(layers)

    def groups(self) -> list[list[int]]:
        """The layer indices of each unit: a unit ends after each neuron; the layers after the last one form one."""
        out, current = [], []
        for i, layer in enumerate(self.layers):
            current.append(i)
            if isinstance(layer, BaseNode):
                out.append(current)
                current = []
        return out + ([current] if current else [])

    def units(self) -> list[Unit]:
        """One unit per group of layers (``groups``), named ``layers.FIRST-LAST`` (``layers.i`` for one layer)."""
        units = []
        for idx in self.groups():
            name = f"layers.{idx[0]}" if len(idx) == 1 else f"layers.{idx[0]}-{idx[-1]}"
            owns = tuple(f"layers.{i}" for i in idx)
            units.append(remat.unit(self, name, owns, self, _Run(tuple(idx))))
        return units

    def spike_inputs(self) -> list[tuple[nnx.Module, str]]:
        """The convolutions / linear layers whose input is a neuron's spikes (through flatten or max pooling)."""
        out, after_neuron = [], False
        for layer in self.layers:
            if isinstance(layer, BaseNode):
                after_neuron = True
            elif after_neuron and isinstance(layer, (nnx.Conv, nnx.Linear)):
                out.append((layer, "binary"))
                after_neuron = False
            elif not isinstance(layer, _KEEPS_SPIKES):
                after_neuron = False
        return out

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [T, N, ...]`` -> the last layer's output (logits ``[T, N, classes]`` for a classifier)."""
        return run_units(self.units(), x)


class _Run:
    """Runs layers ``idx`` of a ``Sequential`` (hashable, so a unit's function is a static value)."""

    def __init__(self, idx: tuple[int, ...]):
        self.idx = idx

    def __call__(self, model: Sequential, x: jax.Array) -> jax.Array:
        for i in self.idx:
            x = model.layers[i](x)
        return x
