"""A spiking multi-layer perceptron: ``flatten -> [Linear -> neuron] * k -> Linear``.

Tensor parallelism: the hidden layers alternate column- and row-parallel (logical
names ``embed -> mlp``, then ``mlp -> embed``), the head continuing the pattern,
so every pair of layers costs one all-reduce and the neurons between them hold
only their shard of the units.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
from flax import nnx

from snnjax import layers
from snnjax.models import remat
from snnjax.models.units import Unit, run_units
from snnjax.neurons import IFNode, LIFNode, ParametricLIFNode, Sigmoid
from snnjax.neurons.surrogate import Surrogate
from snnjax.parallel.logical import alternate

_NODES = {"IF": IFNode, "LIF": LIFNode, "PLIF": ParametricLIFNode}


class SpikingMLP(nnx.Module):
    """Input ``[T, N, ...]`` (trailing dims flattened) -> logits ``[T, N, num_classes]``."""

    def __init__(self, in_features: int, hidden: Sequence[int] = (256,), num_classes: int = 10, *,
                 neuron: str = "LIF", tau: float = 2.0, decay_input: bool = True, detach_reset: bool = True,
                 surrogate_function: Surrogate = Sigmoid(), v_threshold: float = 1.0,
                 v_reset: float | None = 0.0, batch_norm: bool = False, rngs: nnx.Rngs, dtype=None,
                 param_dtype=None):
        if neuron not in _NODES:
            raise ValueError(f"neuron must be one of {sorted(_NODES)}, got {neuron!r}")
        kwargs = dict(v_threshold=v_threshold, v_reset=v_reset, detach_reset=detach_reset,
                      surrogate_function=surrogate_function, step_mode="m")
        if neuron == "LIF":
            kwargs.update(tau=tau, decay_input=decay_input)
        elif neuron == "PLIF":
            kwargs.update(init_tau=tau, decay_input=decay_input)
        self.flatten = layers.Flatten("hwc")
        fcs, bns, nodes, fin = [], [], [], in_features
        for i, h in enumerate(hidden):
            axes = alternate(i)
            fcs.append(layers.linear(fin, h, rngs=rngs, dtype=dtype, param_dtype=param_dtype, axes=axes))
            if batch_norm:
                bns.append(layers.BatchNorm(h, dtype=dtype, param_dtype=param_dtype, axes=axes[1:]))
            nodes.append(_NODES[neuron](**kwargs))
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
        return out + [remat.unit(self, "head", ("head",), self.head, _head)]

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
