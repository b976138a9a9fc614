"""``SpikingSequential``: a feed-forward SNN built from library layers by a list of layer specs.

It is the model a NIR graph imports into (``snnjax.interop.nir``) and the way to build
conv nets such as SpikingJelly's DVSGestureNet (``dvs_gesture_net``). Input ``[T, N, H, W, C]``
(or ``[T, N, F]``), output ``[T, N, K]``. Each spec is a dict with ``kind`` (``snnjax.deploy.ops.KINDS``):

- ``{"kind": "conv", "features": O, "kernel": k, "stride": 1, "padding": 0, "bias": True}``
- ``{"kind": "linear", "features": O, "bias": True}``
- ``{"kind": "batchnorm"}``, ``{"kind": "flatten"}``, ``{"kind": "dropout"}`` (identity at inference)
- ``{"kind": "avgpool" | "maxpool", "size": k}`` (kernel = stride)
- ``{"kind": "neuron", "type": "IF" | "LIF" | "PLIF", ...}`` plus the neuron's keywords (``tau``,
  ``decay_input``, ``v_threshold``, ``v_reset``, ``detach_reset``, ``surrogate_function``)
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
from flax import nnx

from snnjax import layers
from snnjax.deploy.ops import KINDS, Op, run_ops
from snnjax.neurons import IFNode, LIFNode, ParametricLIFNode
from snnjax.neurons import surrogate as sg

_NEURONS = {"IF": IFNode, "LIF": LIFNode, "PLIF": ParametricLIFNode}


class SpikingSequential(nnx.Module):
    """Layers from ``specs`` applied in order to ``[T, N, *in_shape]`` (see the module docstring).

    ``in_shape``: one example at one time step, ``(H, W, C)`` or ``(F,)``.
    """

    def __init__(self, in_shape: Sequence[int], specs: Sequence[Mapping[str, Any]], *, rngs: nnx.Rngs,
                 dtype=None, param_dtype=None):
        shape = tuple(int(d) for d in in_shape)
        mods, kinds = [], []
        for i, spec in enumerate(specs):
            kind = spec.get("kind")
            if kind not in KINDS:
                raise ValueError(f"specs[{i}]: kind {kind!r} is not one of {list(KINDS)}")
            module, shape = _build(i, dict(spec), shape, rngs, dtype, param_dtype)
            mods.append(module)
            kinds.append((kind, int(spec.get("size", 0))))
        self.in_shape = tuple(int(d) for d in in_shape)
        self.out_shape = shape
        self.kinds = tuple(kinds)
        self.layers = nnx.List(mods)

    def ops(self) -> list[Op]:
        """The layers as :class:`snnjax.deploy.ops.Op` (names ``layers.<i>``)."""
        return [Op(kind, f"layers.{i}", self.layers[i], size)
                for i, (kind, size) in enumerate(self.kinds)]

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [T, N, *in_shape]`` -> ``[T, N, *out_shape]``."""
        return run_ops(self.ops(), x)


def _build(i: int, spec: dict, shape: tuple[int, ...], rngs, dtype, param_dtype):
    kind = spec.pop("kind")
    where = f"specs[{i}] ({kind})"
    if kind == "conv":
        if len(shape) != 3:
            raise ValueError(f"{where} needs an input [H, W, C], got {shape}")
        k, s, p = int(spec["kernel"]), int(spec.get("stride", 1)), int(spec.get("padding", 0))
        conv = layers.conv2d(shape[2], int(spec["features"]), k, stride=s, padding=p,
                             use_bias=bool(spec.get("bias", True)), rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        h, w = ((d + 2 * p - k) // s + 1 for d in shape[:2])
        return conv, (h, w, int(spec["features"]))
    if kind == "linear":
        if len(shape) != 1:
            raise ValueError(f"{where} needs a flat input [F] (add a flatten), got {shape}")
        return (layers.linear(shape[0], int(spec["features"]), use_bias=bool(spec.get("bias", True)), rngs=rngs,
                              dtype=dtype, param_dtype=param_dtype), (int(spec["features"]),))
    if kind == "batchnorm":
        return layers.BatchNorm(shape[-1], dtype=dtype, param_dtype=param_dtype), shape
    if kind in ("avgpool", "maxpool"):
        size = int(spec["size"])
        if len(shape) != 3:
            raise ValueError(f"{where} needs an input [H, W, C], got {shape}")
        return None, (shape[0] // size, shape[1] // size, shape[2])
    if kind == "flatten":
        n = 1
        for d in shape:
            n *= d
        return None, (n,)
    if kind == "dropout":
        return None, shape
    neuron = spec.pop("type", "LIF")
    if neuron not in _NEURONS:
        raise ValueError(f"{where}: type {neuron!r} is not one of {sorted(_NEURONS)}")
    if isinstance(spec.get("surrogate_function"), str):
        spec["surrogate_function"] = sg.get(spec["surrogate_function"])
    return _NEURONS[neuron](step_mode="m", **spec), shape


def dvs_gesture_net(in_shape: Sequence[int] = (128, 128, 2), channels: int = 128, num_classes: int = 11, *,
                    blocks: int = 5, hidden: int = 512, pool: str = "max", neuron: Mapping[str, Any] | None = None,
                    rngs: nnx.Rngs, dtype=None, param_dtype=None) -> SpikingSequential:
    """SpikingJelly's DVSGestureNet layout from library layers: ``blocks`` x [Conv3x3 (no bias) -> BatchNorm ->
    neuron -> pool 2], flatten, dropout, Linear(hidden) -> neuron, dropout, Linear(num_classes).

    SpikingJelly ends with ``Linear(10 * num_classes) -> neuron -> VotingLayer(10)``; here the last layer is
    a plain ``Linear(num_classes)`` giving logits. ``pool``: ``"max"`` (SpikingJelly's) or ``"avg"``.
    ``neuron``: the neuron spec (default LIF, tau 2, hard reset to 0, detach_reset).
    """
    if pool not in ("max", "avg"):
        raise ValueError(f"pool must be 'max' or 'avg', got {pool!r}")
    cell = {"kind": "neuron", "type": "LIF", "tau": 2.0, "detach_reset": True, **(neuron or {})}
    specs: list[dict[str, Any]] = []
    for _ in range(blocks):
        specs += [{"kind": "conv", "features": channels, "kernel": 3, "padding": 1, "bias": False},
                  {"kind": "batchnorm"}, dict(cell), {"kind": f"{pool}pool", "size": 2}]
    specs += [{"kind": "flatten"}, {"kind": "dropout"}, {"kind": "linear", "features": hidden}, dict(cell),
              {"kind": "dropout"}, {"kind": "linear", "features": num_classes}]
    return SpikingSequential(in_shape, specs, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
