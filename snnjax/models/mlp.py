"""A spiking multi-layer perceptron: ``flatten -> [Linear -> neuron] * k -> Linear [-> readout]``.

Tensor parallelism: the hidden layers alternate column- and row-parallel (logical
names ``embed -> mlp``, then ``mlp -> embed``), the head continuing the pattern,
so every pair of layers costs one all-reduce and the neurons between them hold
only their shard of the units.

Neurons (``snnjax.models.neuron_options``): ``spiking_neuron`` and the neuron keywords (``**kwargs``);
with None, LIF with ``detach_reset=True`` (the model's default) and the given keywords over it.

``readout``: a neuron spec (``{"type": "NonSpikingLIFNode", "tau": 5.0}``, ``neuron_options.from_spec``) applied
to the head's outputs, as the snnTorch / Norse SHD tutorials read a leaky integrator's membrane potential: the model
then returns the potentials ``[T, N, num_classes]``, which the trainer's losses read like logits (``ce``: the
cross-entropy of their time mean). None: the head's outputs.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from flax import nnx

from snnjax import layers
from snnjax.models import remat
from snnjax.models.neuron_options import Neurons, from_spec
from snnjax.models.registry import DataShape, register
from snnjax.models.units import Unit, run_units
from snnjax.neurons.modules import BaseNode
from snnjax.parallel.logical import alternate

NEURON_DEFAULTS = {"detach_reset": True}


class SpikingMLP(nnx.Module):
    """Input ``[T, N, ...]`` (trailing dims flattened) -> logits ``[T, N, num_classes]``. ``rngs``: default
    ``nnx.Rngs(0)``."""

    def __init__(self, in_features: int, hidden: Sequence[int] = (256,), num_classes: int = 10, *,
                 batch_norm: bool = False, spiking_neuron: type[BaseNode] | str | None = None,
                 readout: Mapping[str, Any] | None = None, rngs: nnx.Rngs | None = None, dtype=None,
                 param_dtype=None, **kwargs):
        neurons = Neurons.of(spiking_neuron, kwargs, model="SpikingMLP")
        if readout is not None and dict(readout).get("decode") is not None:
            raise ValueError(f"SpikingMLP: readout {dict(readout)} reduces over time (decode); the model returns "
                             "[T, N, classes] and the trainer's loss reduces over T: leave decode out")
        self.readout = None if readout is None else from_spec(readout, "SpikingMLP's readout")
        rngs = nnx.Rngs(0) if rngs is None else rngs
        self.flatten = layers.Flatten("hwc")
        fcs, bns, nodes, fin = [], [], [], in_features
        for i, h in enumerate(hidden):
            axes = alternate(i)
            fcs.append(layers.linear(fin, h, rngs=rngs, dtype=dtype, param_dtype=param_dtype, axes=axes))
            if batch_norm:
                bns.append(layers.BatchNorm(h, dtype=dtype, param_dtype=param_dtype, axes=axes[1:]))
            nodes.append(neurons.make(**NEURON_DEFAULTS))
            fin = h
        self.fcs, self.neurons = nnx.List(fcs), nnx.List(nodes)
        self.bns = nnx.List(bns) if batch_norm else None
        self.head = layers.linear(fin, num_classes, rngs=rngs, dtype=dtype, param_dtype=param_dtype,
                                  axes=(alternate(len(hidden))[0], "classes"))

    def units(self) -> list[Unit]:
        """One unit per hidden layer (``Linear -> [BatchNorm] -> neuron``; the first flattens), then the head."""
        out = []
        for i in range(len(self.fcs)):
            owns = (f"fcs.{i}", f"neurons.{i}") + ((f"bns.{i}",) if self.bns is not None else ())
            out.append(remat.unit(self, f"layers.{i}", owns, self, functools.partial(_layer, i)))
        if self.readout is None:
            return out + [remat.unit(self, "head", ("head",), self.head, _head)]
        return out + [remat.unit(self, "head", ("head", "readout"), self, _head_readout)]

    def spike_inputs(self) -> list[tuple[nnx.Module, str]]:
        """The layers that consume spikes (``snnjax.models.remat``): every linear layer after the first."""
        return [(fc, "binary") for fc in list(self.fcs)[1:]] + ([(self.head, "binary")] if len(self.fcs) else [])

    def _layer(self, i: int, x: jax.Array) -> jax.Array:
        x = self.fcs[i](self.flatten(x) if i == 0 else x)
        return self.neurons[i](self.bns[i](x) if self.bns is not None else x)

    def __call__(self, x: jax.Array) -> jax.Array:
        return run_units(self.units(), x)


def _layer(i: int, model: SpikingMLP, x: jax.Array) -> jax.Array:
    return model._layer(i, x)


def _head(head: nnx.Module, x: jax.Array) -> jax.Array:
    return head(layers.flatten_features(x))


def _head_readout(model: SpikingMLP, x: jax.Array) -> jax.Array:
    return model.readout(_head(model.head, x))


def _sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
    return {"in_features": math.prod(data.frame_shape), "num_classes": data.num_classes}


register("mlp", SpikingMLP, _sizes, ("in_features", "num_classes"))
