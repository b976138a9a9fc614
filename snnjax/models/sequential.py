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
made from the layers: a unit ends after each spiking neuron and the layers without parameters
right after it (scaling, pooling, flatten), and whatever follows (a classifier head) is one more
unit. Layer ``i`` is ``net.layers[i]``; its variables' paths start ``layers.i`` (and its
SpikingJelly ``nn.Sequential`` key prefix is ``i.``, which ``snnjax.interop.layers`` uses to
import such a model's weights).

``Sequential.from_specs(in_shape, specs, rngs=...)`` builds the layers from plain dicts, the sizes
following from ``in_shape`` (one example at one time step, ``(H, W, C)`` or ``(F,)``); a NIR graph
imports into this form (``snnjax.deploy.nir``). Each spec has a ``kind`` (``KINDS``):

- ``{"kind": "conv", "features": O, "kernel": k, "stride": 1, "padding": 0, "bias": True}``
- ``{"kind": "linear", "features": O, "bias": True}``
- ``{"kind": "batchnorm"}``, ``{"kind": "dropout"}`` (rate 0: the identity)
- ``{"kind": "flatten", "order": "hwc"}`` (``layers.Flatten``; ``"chw"`` is torch's order)
- ``{"kind": "avgpool" | "maxpool", "size": k}`` (kernel = stride)
- ``{"kind": "neuron", "type": "IF" | "LIF" | "PLIF" | "CUBALIFNode" | ..., ...}`` plus the neuron's keywords
  (``tau`` / PLIF's ``init_tau``, ``decay_input``, ``v_threshold``, ``v_reset``, ``detach_reset``,
  ``surrogate_function``, a catalogue neuron's own; the names are ``snnjax.models.neuron_options.NEURONS``)

Streaming, export, op counts and NIR run a Sequential's own layers (``snnjax.deploy``).

Online training through time (``snnjax.neurons.online``): where an ``OTTTLIFNode`` hands on ``(spike, trace)``
pairs, the layers after it take them as SpikingJelly's ``OTTTSequential`` does (``call_layer``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from flax import nnx

from snnjax.layers import AvgPool2d, BatchNorm, Flatten, MaxPool2d, conv2d, dropout, linear
from snnjax.models import remat
from snnjax.models.neuron_options import from_spec
from snnjax.models.units import Unit, run_units
from snnjax.neurons.modules import BaseNode
from snnjax.neurons.online import call_layer, has_params

KINDS = ("flatten", "linear", "conv", "batchnorm", "avgpool", "maxpool", "dropout", "neuron")
_KEEPS_SPIKES = (Flatten, MaxPool2d)  # layers whose output is binary when their input is


class Sequential(nnx.Module):
    """``layers`` applied in order to ``x [T, N, ...]``; each layer an ``nnx.Module`` taking one array."""

    hands_on_traces = True  # its layers take OTTT's (spike, trace) pairs (call_layer)

    def __init__(self, *layers: nnx.Module):
        if not layers:
            raise ValueError("Sequential needs at least one layer")
        for i, layer in enumerate(layers):
            if not isinstance(layer, nnx.Module):
                raise TypeError(f"Sequential: layer {i} is a {type(layer).__name__}, not an nnx.Module; wrap a "
                                "function in a module (e.g. snnjax.layers.Flatten() for a flatten)")
        self.layers = nnx.List(layers)

    @classmethod
    def from_specs(cls, in_shape: Sequence[int], specs: Sequence[Mapping[str, Any]], *, rngs: nnx.Rngs,
                   dtype=None, param_dtype=None) -> Sequential:
        """The layers of ``specs`` (see the module docstring) for inputs ``[T, N, *in_shape]``."""
        shape, built = tuple(int(d) for d in in_shape), []
        for i, spec in enumerate(specs):
            if spec.get("kind") not in KINDS:
                raise ValueError(f"specs[{i}]: kind {spec.get('kind')!r} is not one of {list(KINDS)}")
            layer, shape = _build(i, dict(spec), shape, rngs, dtype, param_dtype)
            built.append(layer)
        return cls(*built)

    def groups(self) -> list[list[int]]:
        """The layer indices of each unit: a unit ends after each neuron and the layers without parameters right
        after it (scaling, pooling, flatten); the layers after those form one more."""
        out, current = [], []
        for i, layer in enumerate(self.layers):
            # A parameter-free layer starting a unit would be recomputed from the spikes it reads, and XLA then keeps
            # more than it saves (the OTTT VGG's Scale: `units` checkpointing lowered no peak); after a pooling the
            # kept tensor is smaller too.
            if not current and out and not isinstance(layer, BaseNode) and not has_params(layer):
                out[-1].append(i)
                continue
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
            x = call_layer(model.layers[i], x)
        return x


def _build(i: int, spec: dict, shape: tuple[int, ...], rngs, dtype, param_dtype) -> tuple[nnx.Module, tuple]:
    """Spec ``i``'s layer for inputs ``[T, N, *shape]``, and its output's ``shape``."""
    kind = spec.pop("kind")
    where = f"specs[{i}] ({kind})"
    if kind in ("conv", "avgpool", "maxpool") and len(shape) != 3:
        raise ValueError(f"{where} needs an input [H, W, C], got {shape}")
    if kind == "conv":
        k, s, p = int(spec["kernel"]), int(spec.get("stride", 1)), int(spec.get("padding", 0))
        conv = conv2d(shape[2], int(spec["features"]), k, stride=s, padding=p,
                      use_bias=bool(spec.get("bias", True)), rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        h, w = ((d + 2 * p - k) // s + 1 for d in shape[:2])
        return conv, (h, w, int(spec["features"]))
    if kind == "linear":
        if len(shape) != 1:
            raise ValueError(f"{where} needs a flat input [F] (add a flatten), got {shape}")
        return (linear(shape[0], int(spec["features"]), use_bias=bool(spec.get("bias", True)), rngs=rngs,
                       dtype=dtype, param_dtype=param_dtype), (int(spec["features"]),))
    if kind == "batchnorm":
        return BatchNorm(shape[-1], dtype=dtype, param_dtype=param_dtype), shape
    if kind in ("avgpool", "maxpool"):
        size = int(spec["size"])
        pooled = (shape[0] // size, shape[1] // size, shape[2])
        return (AvgPool2d if kind == "avgpool" else MaxPool2d)(size), pooled
    if kind == "flatten":
        return Flatten(spec.get("order", "hwc")), (math.prod(shape),)
    if kind == "dropout":
        return dropout(0.0), shape
    return from_spec(spec, where), shape

