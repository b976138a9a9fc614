"""MS-ResNet and Max-ResNet (SpikingJelly's ``ms_resnet``), channels-last and time-major.

Membrane-shortcut ResNet (Hu et al., arXiv 2112.08954): the residual stream carries membrane
potentials, never spikes. Stem ``Conv(k, stride) -> BatchNorm [-> MaxPool(3, 2, 1)]`` (no neuron);
three or four stages of blocks, each
``bn2(conv2(SN(bn1(conv1(SN(x)))))) + shortcut(x)``, the shortcut the identity or
``Conv1x1(stride) -> BatchNorm`` of the block's input (a real value); the first block of every stage
strides by 2 (the first stage too); the head ``SN -> AdaptiveAvgPool(1) -> Linear``. Input
``[T, N, H, W, C]`` or a static image ``[N, H, W, C]`` repeated ``T`` times; logits ``[T, N, classes]``
(SpikingJelly's model returns their time mean, ``out.mean(0)``: the zoo's contract is per-step logits,
the trainer's loss averages over T).

Max-ResNet (arXiv 2505.18608) is the same network with stride 1 in the first stage, max pooling
instead of the strided conv in each transition block (``conv1`` stride 1, then ``MaxPool(3, s, 1)``
after ``bn1``), its own neuron defaults (LIF ``tau=2``, ``detach_reset``), BatchNorm scales 1 and no
zero-initialised last BatchNorm.

Neurons: ``spiking_neuron`` and the neuron keywords (``**kwargs``), resolved as SpikingJelly does
(``snnjax.models.neuron_options``): with None every neuron is MS-ResNet's LIF (``tau=4/3``,
``v_threshold=0.5``, ``detach_reset``, no ``decay_input``, ``Rect(alpha=2)``) with the given keywords
over those defaults; with a class, the given keywords over that class's own defaults.

Variable names follow the torch modules (``layer2[0].conv1``, ``head_lif``, ``head``; torch's
``stem.0`` / ``stem.1`` are ``stem_conv`` / ``stem_bn``, ``downsample.0`` / ``.1`` are
``downsample_conv`` / ``downsample_bn``). Tensor parallelism: each block's ``conv1`` is
column-parallel (``mlp``) and ``conv2`` row-parallel, so the residual stream stays whole (``embed``).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax import layers
from snnjax import layers as snn_layers  # MSResNet's ``layers`` keyword is SpikingJelly's block counts
from snnjax.models import remat
from snnjax.models.neuron_options import Neurons
from snnjax.models.registry import DataShape, Rule, image_frame, register, register_rules
from snnjax.models.spiking_attention import TORCH_INIT
from snnjax.models.units import Unit, run_units
from snnjax.neurons import surrogate as sg
from snnjax.neurons.modules import BaseNode

# max_resnet18's architecture (the registry's preset too).
MAX_RESNET18 = {"layers": (3, 3, 2), "stage_channels": (128, 256, 512), "stem_kernel_size": 3, "stem_stride": 1}
MS_NEURON = {"tau": 4.0 / 3.0, "v_threshold": 0.5, "detach_reset": True, "decay_input": False,
             "surrogate_function": sg.Rect(alpha=2.0)}


def _conv(cin, cout, k, stride, axes, kw):
    return layers.conv2d(cin, cout, k, stride=stride, padding=k // 2, use_bias=False, kernel_init=TORCH_INIT,
                         axes=axes, **kw)


def _bn(c, axis, kw, scale):
    bn = layers.BatchNorm(c, dtype=kw["dtype"], param_dtype=kw["param_dtype"], axes=(axis,))
    bn.scale[...] = jnp.full_like(bn.scale[...], scale)
    return bn


class MSBlock(nnx.Module):
    """``bn2(conv2(SN(pool(bn1(conv1(SN(x))))))) + shortcut(x)`` on ``[T, N, H, W, C]`` membrane potentials.

    ``pool_stride``: 0 (none, ``conv1`` strides by ``stride``) or Max-ResNet's transition pool
    ``MaxPool(3, pool_stride, 1)`` (``conv1`` stride 1).
    """

    def __init__(self, cin: int, cout: int, stride: int, pool_stride: int, make_neuron: Callable[[], BaseNode],
                 bn_scale: float, zero_init: bool, kw: dict):
        self.pool_stride = pool_stride
        self.spike1 = make_neuron()
        self.conv1 = _conv(cin, cout, 3, 1 if pool_stride else stride, ("embed", "mlp"), kw)
        self.bn1 = _bn(cout, "mlp", kw, bn_scale)
        self.spike2 = make_neuron()
        self.conv2 = _conv(cout, cout, 3, 1, ("mlp", "embed"), kw)
        self.bn2 = _bn(cout, "embed", kw, 0.0 if zero_init else bn_scale)
        self.has_downsample = stride != 1 or cin != cout
        if self.has_downsample:
            self.downsample_conv = _conv(cin, cout, 1, stride, ("embed", "embed"), kw)
            self.downsample_bn = _bn(cout, "embed", kw, bn_scale)

    def __call__(self, x: jax.Array) -> jax.Array:
        identity = self.downsample_bn(self.downsample_conv(x)) if self.has_downsample else x
        out = self.bn1(self.conv1(self.spike1(x)))
        if self.pool_stride:
            out = layers.max_pool2d(out, 3, self.pool_stride, 1)
        return self.bn2(self.conv2(self.spike2(out))) + identity


class MSResNet(nnx.Module):
    """SpikingJelly's ``MSResNet``: ``ms_resnet18`` by default (``layers`` 2, 2, 2, 2; ``(3, 4, 6, 3)``: 34).

    ``layers``: blocks per stage, three or four stages; ``stage_channels``:
    their widths (None: ``base_channels`` doubled per stage, from ``base_channels``); the stem is a
    ``stem_kernel_size`` conv with ``stem_stride`` to ``base_channels``, then a max pool if ``stem_pool``.
    ``spiking_neuron`` and ``**kwargs`` (the neuron keywords): see the module docstring. ``rngs``: default
    ``nnx.Rngs(0)``. Logits ``[T, N, classes]`` (SpikingJelly's: ``out.mean(0)``).
    """

    NEURON_DEFAULTS = MS_NEURON
    BN_SCALE = 0.5  # the stem's, shortcuts' and first BatchNorms' initial scale
    ZERO_INIT = True  # each block's last BatchNorm starts at scale 0
    FIRST_STAGE_STRIDE = 2
    POOL_TRANSITIONS = False  # Max-ResNet: transition blocks pool instead of striding conv1

    def __init__(self, T: int = 6, in_channels: int = 3, num_classes: int = 1000,
                 layers: Sequence[int] = (2, 2, 2, 2), base_channels: int = 64, stem_kernel_size: int = 7,
                 stem_stride: int = 2, stem_pool: bool = False, stage_channels: Sequence[int] | None = None,
                 spiking_neuron: type[BaseNode] | str | None = None, *, rngs: nnx.Rngs | None = None, dtype=None,
                 param_dtype=None, **kwargs):
        stage_blocks = tuple(layers)
        if len(stage_blocks) not in (3, 4) or min(stage_blocks) < 1:
            raise ValueError(f"model.layers (layers=) must give three or four positive block counts, "
                             f"got {stage_blocks}")
        if stage_channels is None:
            stage_channels = tuple(base_channels * 2**i for i in range(len(stage_blocks)))
        stage_channels = tuple(stage_channels)
        if len(stage_channels) != len(stage_blocks):
            raise ValueError(f"model.stage_channels (stage_channels=) must give one width per stage of "
                             f"layers={stage_blocks}, got {stage_channels}")
        neurons = Neurons.of(spiking_neuron, kwargs, model=type(self).__name__)
        make_neuron = functools.partial(neurons.make, **self.NEURON_DEFAULTS)
        kw = dict(rngs=nnx.Rngs(0) if rngs is None else rngs, dtype=dtype, param_dtype=param_dtype)
        self.T, self.stem_pool = T, stem_pool
        self.stem_conv = _conv(in_channels, base_channels, stem_kernel_size, stem_stride, ("embed", "embed"), kw)
        self.stem_bn = _bn(base_channels, "embed", kw, self.BN_SCALE)
        cin = base_channels
        for s, (cout, n) in enumerate(zip(stage_channels, stage_blocks, strict=True)):
            stride = self.FIRST_STAGE_STRIDE if s == 0 else 2
            blocks = []
            for b in range(n):
                st = stride if b == 0 else 1
                pool = st if self.POOL_TRANSITIONS and st != 1 else 0
                blocks.append(MSBlock(cin, cout, st, pool, make_neuron, self.BN_SCALE, self.ZERO_INIT, kw))
                cin = cout
            setattr(self, f"layer{s + 1}", nnx.List(blocks))
        self.head_lif = make_neuron()
        self.head = snn_layers.linear(cin, num_classes, kernel_init=TORCH_INIT, axes=("embed", "classes"), **kw)

    def stages(self) -> list[nnx.List]:
        """``[layer1, layer2, layer3(, layer4)]``."""
        return [getattr(self, f"layer{s}") for s in range(1, 5) if hasattr(self, f"layer{s}")]

    def units(self) -> list[Unit]:
        """The stem, every block (``layer{s}.{b}``), then the head (``SN -> AvgPool -> Linear``)."""
        out = [remat.unit(self, "stem", ("stem_conv", "stem_bn"), self, _stem)]
        for s, stage in enumerate(self.stages()):
            out += [remat.unit(self, f"layer{s + 1}.{b}", (f"layer{s + 1}.{b}",), blk, _call)
                    for b, blk in enumerate(stage)]
        return out + [remat.unit(self, "head", ("head_lif", "head"), self, _head)]

    def spike_inputs(self) -> list[tuple[nnx.Module, str]]:
        """The convs that consume spikes (``snnjax.models.remat``): each block's two; the shortcut and the
        head read membrane potentials and firing rates."""
        return [(c, "binary") for stage in self.stages() for blk in stage for c in (blk.conv1, blk.conv2)]

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [T, N, H, W, C_in]`` (or ``[N, H, W, C_in]``, repeated ``T`` times) -> logits ``[T, N, classes]``."""
        return run_units(self.units(), x)


class MaxResNet(MSResNet):
    """SpikingJelly's ``MaxResNet`` (see the module docstring); ``max_resnet18`` is the registry's preset
    (``layers`` 3, 3, 2; ``stage_channels`` 128, 256, 512; a 3x3 stem with stride 1)."""

    NEURON_DEFAULTS = {"tau": 2.0, "detach_reset": True}
    BN_SCALE = 1.0
    ZERO_INIT = False
    FIRST_STAGE_STRIDE = 1
    POOL_TRANSITIONS = True


def _call(module: nnx.Module, x: jax.Array) -> jax.Array:
    return module(x)


def _stem(model: MSResNet, x: jax.Array) -> jax.Array:
    if x.ndim == 4:  # a static image, repeated over T
        x = jnp.broadcast_to(x[None], (model.T, *x.shape))
    elif x.ndim != 5:
        raise ValueError(f"{type(model).__name__} takes [T, N, H, W, C] or [N, H, W, C] input, got shape {x.shape}")
    x = model.stem_bn(model.stem_conv(x))
    return layers.max_pool2d(x, 3, 2, 1) if model.stem_pool else x


def _head(model: MSResNet, x: jax.Array) -> jax.Array:
    return model.head(jnp.mean(model.head_lif(x), axis=(-3, -2)))


def ms_resnet18(T: int = 6, in_channels: int = 3, num_classes: int = 1000,
                spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> MSResNet:
    """SpikingJelly's ``ms_resnet18`` (blocks 2, 2, 2, 2), logits ``[T, N, classes]`` (SpikingJelly's: time mean)."""
    return MSResNet(T=T, in_channels=in_channels, num_classes=num_classes, layers=(2, 2, 2, 2),
                    spiking_neuron=spiking_neuron, **kwargs)


def ms_resnet34(T: int = 6, in_channels: int = 3, num_classes: int = 1000,
                spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> MSResNet:
    """SpikingJelly's ``ms_resnet34`` (blocks 3, 4, 6, 3), logits ``[T, N, classes]`` (SpikingJelly's: time mean)."""
    return MSResNet(T=T, in_channels=in_channels, num_classes=num_classes, layers=(3, 4, 6, 3),
                    spiking_neuron=spiking_neuron, **kwargs)


def max_resnet18(T: int = 4, in_channels: int = 3, num_classes: int = 10,
                 spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> MaxResNet:
    """SpikingJelly's ``max_resnet18`` (CIFAR: blocks 3, 3, 2 of 128, 256, 512 channels, a 3x3 stem with stride 1)."""
    return MaxResNet(T=T, in_channels=in_channels, num_classes=num_classes, spiking_neuron=spiking_neuron,
                     **MAX_RESNET18, **kwargs)


def _sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
    return {"in_channels": image_frame(data, "ms_resnet")[2], "num_classes": data.num_classes, "T": data.time_steps}


_SIZE_KEYS = ("in_channels", "num_classes", "T")
register("ms_resnet18", MSResNet, _sizes, _SIZE_KEYS, {"layers": (2, 2, 2, 2)}, {"stage_channels": tuple})
register("ms_resnet34", MSResNet, _sizes, _SIZE_KEYS, {"layers": (3, 4, 6, 3)}, {"stage_channels": tuple})
register("max_resnet18", MaxResNet, _sizes, _SIZE_KEYS, MAX_RESNET18, {"stage_channels": tuple})

# SpikingJelly's ms_resnet keys (MaxResNet's too, a subclass).
register_rules(MSResNet, [
    Rule(r"stem\.0", "stem_conv", "conv"),
    Rule(r"stem\.1", "stem_bn", "bn"),
    Rule(r"(layer[1-4])\.(\d+)\.(conv[12])", "{1}.{2}.{3}", "conv"),
    Rule(r"(layer[1-4])\.(\d+)\.(bn[12])", "{1}.{2}.{3}", "bn"),
    Rule(r"(layer[1-4])\.(\d+)\.(spike[12])", "{1}.{2}.{3}", "neuron"),
    Rule(r"(layer[1-4])\.(\d+)\.downsample\.0", "{1}.{2}.downsample_conv", "conv"),
    Rule(r"(layer[1-4])\.(\d+)\.downsample\.1", "{1}.{2}.downsample_bn", "bn"),
    Rule(r"head_lif", "head_lif", "neuron"),
    Rule(r"head", "head", "linear"),
])
