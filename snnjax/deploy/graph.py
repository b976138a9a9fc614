"""``layer_ops(model)``: a supported model's eval-mode forward as a chain of :mod:`snnjax.deploy.ops`.

Supported: ``SpikingMLP``, ``CIFAR10DVSVGG`` and ``SpikingSequential``. Spikformer's attention and
residual blocks are not a chain of those ops and are refused with :class:`UnsupportedModelError`.
"""
from __future__ import annotations

from flax import nnx

from snnjax.deploy.ops import KINDS, Op
from snnjax.deploy.sequential import SpikingSequential
from snnjax.models.mlp import SpikingMLP
from snnjax.models.vgg import CIFAR10DVSVGG


class UnsupportedModelError(ValueError):
    """The model is not a chain of the ops :mod:`snnjax.deploy.ops` knows (e.g. attention)."""


def layer_ops(model: nnx.Module) -> list[Op]:
    """The eval-mode forward of ``model`` as a list of :class:`Op`.

    Raises:
      UnsupportedModelError: the model type has no op description (Spikformer's attention, ...).
    """
    if isinstance(model, SpikingMLP):
        return _mlp_ops(model)
    if isinstance(model, CIFAR10DVSVGG):
        return _vgg_ops(model)
    if isinstance(model, SpikingSequential):
        return model.ops()
    raise UnsupportedModelError(
        f"{type(model).__name__} is not a chain of {list(KINDS)}: streaming, energy counts and NIR take "
        "SpikingMLP, CIFAR10DVSVGG and SpikingSequential (attention and residual blocks are not supported)")


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
