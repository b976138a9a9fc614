"""``layer_ops(model)``: a supported model's eval-mode forward as a chain of :mod:`snnjax.deploy.ops`.

Supported: ``SpikingMLP``, ``CIFAR10DVSVGG`` and a ``Sequential`` whose every layer is an op (flatten,
linear, 2-D conv, BatchNorm, pooling with stride = window, dropout, neuron). Spikformer's attention and
residual blocks are not a chain of those ops and are refused with :class:`UnsupportedModelError`.
"""
from __future__ import annotations

from flax import nnx

from snnjax import layers
from snnjax.deploy.ops import Op
from snnjax.models.mlp import SpikingMLP
from snnjax.models.sequential import KINDS, Sequential
from snnjax.models.vgg import CIFAR10DVSVGG
from snnjax.neurons.modules import BaseNode


class UnsupportedModelError(ValueError):
    """The model is not a chain of the ops :mod:`snnjax.deploy.ops` knows (e.g. attention)."""


def layer_ops(model: nnx.Module) -> list[Op]:
    """The eval-mode forward of ``model`` as a list of :class:`Op`.

    Raises:
      UnsupportedModelError: the model type has no op description (Spikformer's attention, ...), or a
        ``Sequential`` holds a layer that is not one of the ops.
    """
    if isinstance(model, SpikingMLP):
        return _mlp_ops(model)
    if isinstance(model, CIFAR10DVSVGG):
        return _vgg_ops(model)
    if isinstance(model, Sequential):
        return [_layer_op(f"layers.{i}", layer) for i, layer in enumerate(model.layers)]
    raise UnsupportedModelError(
        f"{type(model).__name__} is not a chain of {list(KINDS)}: streaming, energy counts and NIR take "
        "SpikingMLP, CIFAR10DVSVGG and Sequential (attention and residual blocks are not supported)")


_LAYER_KINDS = ((layers.Flatten, "flatten"), (nnx.Linear, "linear"), (nnx.Conv, "conv"),
                (layers.BatchNorm, "batchnorm"), (layers.AvgPool2d, "avgpool"), (layers.MaxPool2d, "maxpool"),
                (nnx.Dropout, "dropout"), (BaseNode, "neuron"))


def _layer_op(name: str, layer: nnx.Module) -> Op:
    """The op a ``Sequential``'s layer ``name`` is (pooling: stride = window, no padding; convolutions: 2-D)."""
    kind = next((k for t, k in _LAYER_KINDS if isinstance(layer, t)), None)
    pool = kind in ("avgpool", "maxpool")
    if kind is None or (pool and (layer.stride not in (None, layer.kernel_size) or getattr(layer, "padding", 0))) \
            or (kind == "conv" and len(layer.kernel_size) != 2):
        raise UnsupportedModelError(
            f"{name} is a {type(layer).__name__}, which is not one of the ops {list(KINDS)}: streaming, energy "
            "counts and NIR take a Sequential of layers.Flatten, nnx.Linear, 2-D convolutions, layers.BatchNorm, "
            "layers.AvgPool2d / MaxPool2d (stride = window, no padding), nnx.Dropout and IF / LIF / PLIF neurons")
    return Op(kind, name, layer, layer.kernel_size if pool else 0)


def _mlp_ops(model: SpikingMLP) -> list[Op]:
    ops = [Op("flatten", "flatten")]
    for i in range(len(model.fcs)):
        ops.append(Op("linear", f"fcs.{i}", model.fcs[i]))
        if model.bns is not None:
            ops.append(Op("batchnorm", f"bns.{i}", model.bns[i]))
        ops.append(Op("neuron", f"neurons.{i}", model.neurons[i]))
    return [*ops, Op("linear", "head", model.head)]


def _vgg_ops(model: CIFAR10DVSVGG) -> list[Op]:
    ops = []
    for i, block in enumerate(model.features):
        if block.pool:
            ops.append(Op("avgpool", f"features.{i}.pool", size=2))
        ops += [Op("conv", f"features.{i}.conv", block.conv), Op("batchnorm", f"features.{i}.bn", block.bn),
                Op("neuron", f"features.{i}.neuron", block.neuron)]
    return [*ops, Op("avgpool", "pool", size=2), Op("flatten", "flatten"), Op("dropout", "dropout"),
            Op("linear", "classifier", model.classifier)]
