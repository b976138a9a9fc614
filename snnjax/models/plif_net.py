"""SpikingJelly's parametric-LIF networks (``parametric_lif_net``): ``DVSGestureNet``, ``CIFAR10DVSNet``, ``NMNISTNet``.

``stages`` blocks ``Conv3x3 (no bias) -> BatchNorm -> neuron -> MaxPool(2)`` of ``channels`` channels,
then ``flatten -> Dropout -> Linear(hidden_features) -> neuron -> Dropout -> Linear(num_classes * voting_size) ->
neuron -> VotingLayer(voting_size)``. The dropouts share their mask over time (SpikingJelly's
``layer.Dropout``). Input ``[T, N, H, W, C]``; output ``[T, N, num_classes]``, as SpikingJelly's: per
step, the mean spike of each class's group of neurons (SpikingJelly's DVS Gesture recipe trains it
with the MSE of the time mean against one-hot labels: ``loss="mse"``).

Constructors: SpikingJelly's ``DVSGestureNet``, ``CIFAR10DVSNet``, ``NMNISTNet`` (``channels=128,
spiking_neuron=None, **kwargs``), each a ``ParametricLIFNet`` with its preset; ``kwargs`` are the neuron
keywords every neuron gets (``snnjax.models.neuron_options``) and ``ParametricLIFNet``'s other keywords
(snnjax's: ``image_size``, ``num_classes``, ``dropout``, ...). As in SpikingJelly the neuron class is
required (e.g. ``snnjax.neurons.ParametricLIFNode``).

=================  ======  ======  =====  =============================
SpikingJelly       stages  hidden  input  classes x voting
=================  ======  ======  =====  =============================
``DVSGestureNet``  5       512     128    11 x 10 (``Linear(512, 110)``)
``CIFAR10DVSNet``  4       512     128    10 x 10
``NMNISTNet``      2       2048    34     10 x 10
=================  ======  ======  =====  =============================

(``hidden`` is the ``hidden_features`` keyword.) Flattening is ``[H, W, C]`` order here, torch's ``[C, H, W]``
there (the weight import permutes).
Tensor parallelism: the convs alternate column- and row-parallel; ``fc1`` is column-, ``fc2`` row-parallel.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from flax import nnx

from snnjax import layers
from snnjax.models import remat
from snnjax.models.neuron_options import Neurons
from snnjax.models.registry import DataShape, Rule, image_frame, register, register_rules
from snnjax.models.units import Unit, run_units
from snnjax.neurons.modules import BaseNode
from snnjax.parallel.logical import alternate

PRESETS = {  # SpikingJelly's models; the registry's names are ``{key}_net``
    "dvsgesture": dict(stages=5, hidden_features=512, image_size=128, num_classes=11),
    "cifar10dvs": dict(stages=4, hidden_features=512, image_size=128, num_classes=10),
    "nmnist": dict(stages=2, hidden_features=2048, image_size=34, num_classes=10),
}

_conv_init = jax.nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")  # torch's Conv2d default


class ConvStage(nnx.Module):
    """``Conv3x3 -> BatchNorm -> neuron -> MaxPool(2)`` on ``[T, N, H, W, C]``."""

    def __init__(self, cin: int, cout: int, neurons: Neurons, axes: tuple[str, str], kw: dict):
        self.conv = layers.conv2d(cin, cout, 3, padding=1, use_bias=False, kernel_init=_conv_init, axes=axes, **kw)
        self.bn = layers.BatchNorm(cout, dtype=kw["dtype"], param_dtype=kw["param_dtype"], axes=axes[1:])
        self.neuron = neurons.make()

    def __call__(self, x: jax.Array) -> jax.Array:
        return layers.max_pool2d(self.neuron(self.bn(self.conv(x))), 2, 2)


class ParametricLIFNet(nnx.Module):
    """The family's network; SpikingJelly's models are its ``PRESETS`` (``DVSGestureNet`` etc. below).

    ``spiking_neuron`` (required) and ``**kwargs``, the neuron keywords, build every neuron. ``rngs``: default
    ``nnx.Rngs(0)``.
    """

    def __init__(self, *, stages: int = 5, channels: int = 128, hidden_features: int = 512, in_channels: int = 2,
                 image_size: int = 128, num_classes: int = 11, voting_size: int = 10, dropout: float = 0.5,
                 spiking_neuron: type[BaseNode] | str | None = None, rngs: nnx.Rngs | None = None, dtype=None,
                 param_dtype=None, **kwargs):
        size = image_size // 2 ** stages
        if stages < 1 or size < 1:
            raise ValueError(f"model.stages={stages} halves image_size={image_size} below 1 pixel: choose larger "
                             "frames or fewer stages")
        nrn = Neurons.of(spiking_neuron, kwargs, model=type(self).__name__, required=True)
        rngs = nnx.Rngs(0) if rngs is None else rngs
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.voting_size = voting_size
        self.features = nnx.List([ConvStage(in_channels if i == 0 else channels, channels, nrn, alternate(i), kw)
                                  for i in range(stages)])
        self.feature_shape = (size, size, channels)
        self.dropout1 = layers.dropout(dropout, share_over_time=True, rngs=rngs)
        self.fc1 = layers.linear(size * size * channels, hidden_features, axes=("embed", "mlp"), **kw)
        self.sn1 = nrn.make()
        self.dropout2 = layers.dropout(dropout, share_over_time=True, rngs=rngs)
        self.fc2 = layers.linear(hidden_features, num_classes * voting_size, axes=("mlp", "embed"), **kw)
        self.sn2 = nrn.make()

    def units(self) -> list[Unit]:
        """Each conv stage (``features.i``), ``fc1`` (flatten, dropout, Linear, neuron), ``fc2`` (dropout, Linear,
        neuron, voting)."""
        out = [remat.unit(self, f"features.{i}", (f"features.{i}",), s, _call) for i, s in enumerate(self.features)]
        return out + [remat.unit(self, "fc1", ("dropout1", "fc1", "sn1"), self, _fc1),
                      remat.unit(self, "fc2", ("dropout2", "fc2", "sn2"), self, _fc2)]

    def spike_inputs(self) -> list[tuple[nnx.Module, str]]:
        """The layers that consume spikes (``snnjax.models.remat``): convs after the first (max-pooled spikes),
        ``fc1`` and ``fc2`` when no dropout scales them."""
        out = [(s.conv, "binary") for s in list(self.features)[1:]]
        if self.dropout1.rate == 0:
            out += [(self.fc1, "binary"), (self.fc2, "binary")]
        return out

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [T, N, H, W, C_in]`` -> class outputs ``[T, N, num_classes]``."""
        return run_units(self.units(), x)


def _call(module: nnx.Module, x: jax.Array) -> jax.Array:
    return module(x)


def _fc1(model: ParametricLIFNet, x: jax.Array) -> jax.Array:
    return model.sn1(model.fc1(model.dropout1(layers.flatten_features(x))))


def _fc2(model: ParametricLIFNet, x: jax.Array) -> jax.Array:
    return layers.vote(model.sn2(model.fc2(model.dropout2(x))), model.voting_size)


def DVSGestureNet(channels: int = 128, spiking_neuron: type[BaseNode] | str | None = None,
                  **kwargs) -> ParametricLIFNet:
    """SpikingJelly's ``DVSGestureNet`` (128x128 DVS128 Gesture frames, 11 classes)."""
    return ParametricLIFNet(**{**PRESETS["dvsgesture"], "channels": channels, "spiking_neuron": spiking_neuron,
                               **kwargs})


def CIFAR10DVSNet(channels: int = 128, spiking_neuron: type[BaseNode] | str | None = None,
                  **kwargs) -> ParametricLIFNet:
    """SpikingJelly's ``CIFAR10DVSNet`` (128x128 CIFAR10-DVS frames, 10 classes)."""
    return ParametricLIFNet(**{**PRESETS["cifar10dvs"], "channels": channels, "spiking_neuron": spiking_neuron,
                               **kwargs})


def NMNISTNet(channels: int = 128, spiking_neuron: type[BaseNode] | str | None = None,
              **kwargs) -> ParametricLIFNet:
    """SpikingJelly's ``NMNISTNet`` (34x34 N-MNIST frames, 10 classes)."""
    return ParametricLIFNet(**{**PRESETS["nmnist"], "channels": channels, "spiking_neuron": spiking_neuron,
                               **kwargs})


def _sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
    h, w, c = image_frame(data, "parametric-LIF net")
    stages = options.get("stages", 5)
    if h != w or h < 2 ** stages:
        raise ValueError(f"the parametric-LIF nets take square frames of at least {2 ** stages}x{2 ** stages} "
                         f"(model.stages={stages} poolings); the data gives {h}x{w}: resize it (e.g. "
                         "--config.data.options.size=128) or lower model.stages")
    return {"in_channels": c, "image_size": h, "num_classes": data.num_classes}


for _name, _preset in PRESETS.items():
    register(f"{_name}_net", ParametricLIFNet, _sizes, ("in_channels", "image_size", "num_classes"), _preset)


def _import_rules(model: ParametricLIFNet) -> list[Rule]:
    """SpikingJelly's keys: the ``conv_fc`` Sequential holds ``Conv, BN, neuron, MaxPool`` per conv stage, then
    ``Flatten, Dropout, Linear, neuron, Dropout, Linear, neuron, VotingLayer``."""
    table = []
    for i in range(len(model.features)):
        table += [Rule(rf"conv_fc\.{4 * i}", f"features.{i}.conv", "conv"),
                  Rule(rf"conv_fc\.{4 * i + 1}", f"features.{i}.bn", "bn"),
                  Rule(rf"conv_fc\.{4 * i + 2}", f"features.{i}.neuron", "neuron")]
    head = 4 * len(model.features)
    return table + [Rule(rf"conv_fc\.{head + 2}", "fc1", "flat_linear"),
                    Rule(rf"conv_fc\.{head + 3}", "sn1", "neuron"),
                    Rule(rf"conv_fc\.{head + 5}", "fc2", "linear"),
                    Rule(rf"conv_fc\.{head + 6}", "sn2", "neuron")]


register_rules(ParametricLIFNet, _import_rules)  # DVSGestureNet, CIFAR10DVSNet, NMNISTNet
