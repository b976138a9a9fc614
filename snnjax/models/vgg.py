"""CIFAR10DVSVGG: SpikingJelly's spiking VGG for CIFAR10-DVS (2 x 48 x 48 event frames).

Each block is ``[AvgPool2d(2)] -> Conv3x3 (bias) -> BatchNorm -> LIF``; after the
last block ``AvgPool2d(2) -> flatten -> Dropout -> Linear``. Input
``[T, N, H, W, C]`` (SpikingJelly's takes ``[N, T, C, H, W]``), output logits ``[T, N, num_classes]``
as SpikingJelly's.

Neurons (``snnjax.models.neuron_options``): SpikingJelly's model takes ``tau`` (1.333), ``decay_input``
(False), ``detach_reset`` (True) and ``surrogate_function`` (``ATan()``) for its LIF neurons; here they
are the ``spiking_neuron=None`` defaults of the neuron keywords (``**kwargs``), and a
``spiking_neuron`` class (an snnjax extension) takes the given keywords over its own defaults. With
``spiking_neuron=OTTTLIFNode`` it trains with ``method="ottt"``: the blocks and the head run their layers through
``snnjax.neurons.online.call_layer`` as a ``Sequential`` of the same layers does (SpikingJelly's ``OTTTSequential``).

Tensor parallelism: the convolutions alternate column-parallel (output channels
``mlp``) and row-parallel (input channels ``mlp``); bias, BatchNorm parameters and
statistics and the neurons follow their channels, so each pair of blocks costs one
all-reduce (the row-parallel conv's partial sums). The row-parallel conv's output is
named ``(time, batch, height, -, embed)``: with sequence parallelism its height is split
over ``tensor`` too.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
from flax import nnx

from snnjax import layers
from snnjax.models import remat
from snnjax.models.neuron_options import Neurons
from snnjax.models.registry import DataShape, Rule, image_frame, register, register_rules
from snnjax.models.units import Unit, run_units
from snnjax.neurons import ATan
from snnjax.neurons.modules import BaseNode
from snnjax.neurons.online import call_layer
from snnjax.parallel.logical import alternate, constrain

DEFAULT_WIDTHS = (64, 128, 256, 256, 512, 512, 512, 512)
DEFAULT_POOLS = (False, False, True, False, True, False, True, False)

# torch's kaiming_normal_(mode="fan_out", nonlinearity="relu"), as SpikingJelly initialises the convs.
_conv_init = jax.nn.initializers.variance_scaling(2.0, "fan_out", "normal")
NEURON_DEFAULTS = {"tau": 1.333, "decay_input": False, "detach_reset": True, "surrogate_function": ATan()}


class VGGBlock(nnx.Module):
    """``[AvgPool2d(2)] -> Conv2d(3x3, padding 1) -> BatchNorm -> LIF`` on ``[T, N, H, W, C]``."""

    def __init__(self, in_channels: int, out_channels: int, pool: bool, neuron: BaseNode, *, rngs: nnx.Rngs,
                 dtype=None, param_dtype=None, axes: tuple[str, str] = ("embed", "mlp")):
        self.pool = pool
        self.avgpool = layers.AvgPool2d(2) if pool else None
        self.conv = layers.conv2d(in_channels, out_channels, 3, padding=1, kernel_init=_conv_init,
                                  rngs=rngs, dtype=dtype, param_dtype=param_dtype, axes=axes)
        self.bn = layers.BatchNorm(out_channels, dtype=dtype, param_dtype=param_dtype, axes=axes[1:])
        self.neuron = neuron
        self.row_parallel = axes[1] != "mlp"

    hands_on_traces = True  # OTTT's (spike, trace) pairs pass through call_layer, as in a Sequential

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.avgpool is not None:
            x = call_layer(self.avgpool, x)
        y = call_layer(self.conv, x)
        if self.row_parallel:  # whole channels after the partial sums; rows split under sequence parallelism
            y = constrain(y, ("time", "batch", "height", None, "embed"))
        return call_layer(self.neuron, call_layer(self.bn, y))


class CIFAR10DVSVGG(nnx.Module):
    """Spiking VGG; ``widths``/``pools`` configure the 8 blocks (SpikingJelly's by default). ``spiking_neuron`` and
    ``**kwargs`` (the neuron keywords): see the module docstring. ``rngs``: default ``nnx.Rngs(0)``."""

    hands_on_traces = True

    def __init__(self, *, widths: Sequence[int] = DEFAULT_WIDTHS, pools: Sequence[bool] = DEFAULT_POOLS,
                 in_channels: int = 2, image_size: int = 48, num_classes: int = 10, dropout: float = 0.25,
                 spiking_neuron: type[BaseNode] | str | None = None, rngs: nnx.Rngs | None = None, dtype=None,
                 param_dtype=None, **kwargs):
        if len(widths) != len(pools):
            raise ValueError(f"widths ({len(widths)}) and pools ({len(pools)}) must have the same length")
        neurons = Neurons.of(spiking_neuron, kwargs, model="CIFAR10DVSVGG")
        rngs = nnx.Rngs(0) if rngs is None else rngs
        blocks, cin, size = [], in_channels, image_size
        for i, (w, p) in enumerate(zip(widths, pools, strict=True)):
            blocks.append(VGGBlock(cin, w, p, neurons.make(**NEURON_DEFAULTS), rngs=rngs, dtype=dtype,
                                   param_dtype=param_dtype, axes=alternate(i)))
            cin, size = w, size // 2 if p else size
        size //= 2  # the final AvgPool2d(2)
        if size < 1:
            raise ValueError(f"image_size={image_size} is too small for {sum(pools) + 1} poolings")
        self.features = nnx.List(blocks)
        self.feature_shape = (size, size, cin)
        self.pool, self.flatten = layers.AvgPool2d(2), layers.Flatten("hwc")
        self.dropout = layers.dropout(dropout, rngs=rngs)
        # With an odd number of blocks the features are channel-split; the classifier then gathers them.
        self.classifier = layers.linear(cin * size * size, num_classes, rngs=rngs, dtype=dtype,
                                        param_dtype=param_dtype, axes=("embed", "classes"))

    def units(self) -> list[Unit]:
        """The 8 blocks, then the head (``AvgPool2d(2) -> flatten -> Dropout -> Linear``)."""
        blocks = [remat.unit(self, f"features.{i}", (f"features.{i}",), block, _call)
                  for i, block in enumerate(self.features)]
        return blocks + [remat.unit(self, "head", ("dropout", "classifier"), self, _head)]

    def spike_inputs(self) -> list[tuple[nnx.Module, str]]:
        """The layers that consume spikes (``snnjax.models.remat``): every conv after the first (its input
        average-pooled in pooling blocks, so multiples of 1/4)."""
        return [(b.conv, "quarters" if b.pool else "binary") for b in list(self.features)[1:]]

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [T, N, H, W, C_in]`` -> logits ``[T, N, num_classes]``."""
        return run_units(self.units(), x)


def _call(module: nnx.Module, x: jax.Array) -> jax.Array:
    return module(x)


def _head(model: CIFAR10DVSVGG, x: jax.Array) -> jax.Array:
    for layer in (model.pool, model.flatten, model.dropout, model.classifier):
        x = call_layer(layer, x)
    return x


def _sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
    h, w, c = image_frame(data, "cifar10dvs_vgg")
    if h != w:
        raise ValueError(f"model 'cifar10dvs_vgg' takes square frames (one image_size); the data gives {h}x{w}: "
                         "resize it (e.g. --config.data.options.size=48) or choose another model")
    min_size = 2 ** (sum(map(bool, options.get("pools", DEFAULT_POOLS))) + 1)  # each pool and the final one halve
    if h < min_size:
        raise ValueError(f"model 'cifar10dvs_vgg' pools its frames down by {min_size}; the data gives {h}x{w}: "
                         f"choose data with frames of at least {min_size}x{min_size}, fewer model.pools, or "
                         "another model")
    return {"in_channels": c, "image_size": h, "num_classes": data.num_classes}


register("cifar10dvs_vgg", CIFAR10DVSVGG, _sizes, ("in_channels", "image_size", "num_classes"))


def _import_rules(model: CIFAR10DVSVGG) -> list[Rule]:
    """SpikingJelly's keys: block ``i``'s ``proj_bn`` Sequential holds ``[AvgPool2d,] Conv2d, BatchNorm`` (the pool
    where block ``i`` pools), then ``classifier`` holds ``[Dropout,] Linear``."""
    table = []
    for i, block in enumerate(model.features):
        table += [Rule(rf"features\.{i}\.proj_bn\.{int(block.pool)}", f"features.{i}.conv", "conv"),
                  Rule(rf"features\.{i}\.proj_bn\.{int(block.pool) + 1}", f"features.{i}.bn", "bn")]
    return table + [Rule(r"classifier\.\d+", "classifier", "flat_linear")]


register_rules(CIFAR10DVSVGG, _import_rules)
