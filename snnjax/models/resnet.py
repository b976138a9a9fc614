"""Spiking ResNet and SEW-ResNet (SpikingJelly's ``spiking_resnet`` / ``sew_resnet``), channels-last, time-major.

Both are torchvision's ResNet with spiking neurons: a stem ``Conv7x7/2 -> BatchNorm -> neuron ->
MaxPool(3, 2, 1)``, four stages of residual blocks (``widths``, the first block of stages 2-4
striding by 2), ``AdaptiveAvgPool(1) -> Linear``. Input ``[T, N, H, W, C]``, logits ``[T, N, classes]``.

- Spiking ResNet: the neuron comes *after* the residual sum: ``sn(bn(conv(...)) + identity)``; the
  projection shortcut is ``Conv1x1 -> BatchNorm``.
- SEW-ResNet (``cnf`` = ``ADD``, ``AND``, ``IAND``): every branch ends in a neuron and the block joins
  spikes, ``sew_connect(identity, out)`` (basic block) or ``sew_connect(out, identity)`` (bottleneck),
  the projection shortcut being ``Conv1x1 -> BatchNorm -> neuron``.

Constructors: SpikingJelly's ``spiking_resnet18/34/50(pretrained=False, progress=True, spiking_neuron=None,
**kwargs)`` and ``sew_resnet18/34/50(..., cnf=None, ...)``; ``kwargs`` holds ``ResNet``'s keywords and the
neuron keywords every neuron gets (``snnjax.models.neuron_options``). As in SpikingJelly the neuron class
is required (``snnjax.neurons.IFNode``, ..., or a name), and so is ``cnf`` for SEW-ResNet. snnjax adds
``in_channels`` (SpikingJelly's stem takes 3), ``widths``, ``stage_blocks`` and ``rngs`` (default
``nnx.Rngs(0)``); torch's ``groups``, ``width_per_group``, ``replace_stride_with_dilation`` and ``norm_layer``
are accepted at their defaults only. Output: logits ``[T, N, classes]``, as SpikingJelly's.

Variable names follow the torch modules (``conv1``, ``bn1``, ``sn1``, ``layer2[0].conv1``, ...;
torch's ``downsample.0`` / ``downsample.1`` are ``downsample_conv`` / ``downsample_bn``).

Tensor parallelism: each block's first conv is column-parallel (output channels ``mlp``) and the
next row-parallel, so the residual stream stays whole (``embed``); a bottleneck's last 1x1 conv
and the shortcut projections stay whole.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax import layers
from snnjax.models import remat
from snnjax.models.neuron_options import Neurons
from snnjax.models.registry import DataShape, Rule, image_frame, register, register_rules
from snnjax.models.units import Unit, run_units
from snnjax.neurons.modules import BaseNode

BLOCKS = ("basic", "bottleneck")
DEPTHS = {18: ("basic", (2, 2, 2, 2)), 34: ("basic", (3, 4, 6, 3)), 50: ("bottleneck", (3, 4, 6, 3))}
DEFAULT_WIDTHS = (64, 128, 256, 512)
# SpikingJelly's torch-only ResNet keywords, accepted at these defaults only.
TORCH_DEFAULTS = {"groups": 1, "width_per_group": 64, "replace_stride_with_dilation": None, "norm_layer": None}

# torch's kaiming_normal_(mode="fan_out", nonlinearity="relu"), as SpikingJelly initialises the convs.
_conv_init = jax.nn.initializers.variance_scaling(2.0, "fan_out", "normal")


def _conv(cin, cout, k, stride, axes, kw):
    return layers.conv2d(cin, cout, k, stride=stride, padding=k // 2, use_bias=False, kernel_init=_conv_init,
                         axes=axes, **kw)


def _bn(c, axis, kw, zero=False):
    bn = layers.BatchNorm(c, dtype=kw["dtype"], param_dtype=kw["param_dtype"], axes=(axis,))
    if zero:
        bn.scale[...] = jnp.zeros_like(bn.scale[...])
    return bn


class ResidualBlock(nnx.Module):
    """One basic (two 3x3 convs) or bottleneck (1x1, 3x3, 1x1 with 4x expansion) block on ``[T, N, H, W, C]``.

    ``cnf`` None: Spiking ResNet's block; ``ADD`` / ``AND`` / ``IAND``: SEW-ResNet's.
    """

    def __init__(self, cin: int, planes: int, stride: int, block: str, cnf: str | None, neurons: Neurons,
                 zero_init_residual: bool, kw: dict):
        self.block, self.cnf = block, cnf
        expansion = 4 if block == "bottleneck" else 1
        cout = planes * expansion
        zero = zero_init_residual
        if block == "basic":
            self.conv1 = _conv(cin, planes, 3, stride, ("embed", "mlp"), kw)
            self.bn1, self.sn1 = _bn(planes, "mlp", kw), neurons.make()
            self.conv2 = _conv(planes, planes, 3, 1, ("mlp", "embed"), kw)
            self.bn2, self.sn2 = _bn(planes, "embed", kw, zero), neurons.make()
        else:
            self.conv1 = _conv(cin, planes, 1, 1, ("embed", "mlp"), kw)
            self.bn1, self.sn1 = _bn(planes, "mlp", kw), neurons.make()
            self.conv2 = _conv(planes, planes, 3, stride, ("mlp", "embed"), kw)
            self.bn2, self.sn2 = _bn(planes, "embed", kw), neurons.make()
            self.conv3 = _conv(planes, cout, 1, 1, ("embed", "embed"), kw)
            self.bn3, self.sn3 = _bn(cout, "embed", kw, zero), neurons.make()
        self.has_downsample = stride != 1 or cin != cout
        if self.has_downsample:
            self.downsample_conv = _conv(cin, cout, 1, stride, ("embed", "embed"), kw)
            self.downsample_bn = _bn(cout, "embed", kw)
            if cnf is not None:
                self.downsample_sn = neurons.make()

    def __call__(self, x: jax.Array) -> jax.Array:
        identity = x
        if self.has_downsample:
            identity = self.downsample_bn(self.downsample_conv(x))
            if self.cnf is not None:
                identity = self.downsample_sn(identity)
        out = self.sn1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        last = self.sn2
        if self.block == "bottleneck":
            out = self.bn3(self.conv3(self.sn2(out)))
            last = self.sn3
        if self.cnf is None:  # Spiking ResNet: the neuron after the sum
            return last(out + identity)
        out = last(out)
        if self.block == "basic":
            return layers.sew_connect(identity, out, self.cnf)
        return layers.sew_connect(out, identity, self.cnf)

    def convs(self) -> list[nnx.Module]:
        """The convolutions of the block, in order (the shortcut's last)."""
        out = [self.conv1, self.conv2] + ([self.conv3] if self.block == "bottleneck" else [])
        return out + ([self.downsample_conv] if self.has_downsample else [])


class ResNet(nnx.Module):
    """Spiking ResNet (``cnf=None``) or SEW-ResNet (``cnf`` in ``ADD``, ``AND``, ``IAND``) of ``depth`` 18, 34 or 50.

    ``widths``: the four stages' planes (SpikingJelly's 64, 128, 256, 512; the stem has ``widths[0]``
    channels). ``stage_blocks``: blocks per stage (SpikingJelly's ``layers``), by default the depth's
    (18: 2, 2, 2, 2; 34 and 50: 3, 4, 6, 3); the depth then only picks the block kind.
    ``spiking_neuron`` (required) and ``**kwargs``, the neuron keywords, build every neuron
    (``snnjax.models.neuron_options``). Input ``[T, N, H, W, C]``; logits ``[T, N, num_classes]``.
    """

    def __init__(self, *, depth: int = 18, cnf: str | None = None, widths: Sequence[int] = DEFAULT_WIDTHS,
                 stage_blocks: Sequence[int] | None = None, in_channels: int = 3, num_classes: int = 1000,
                 zero_init_residual: bool = False, spiking_neuron: type[BaseNode] | str | None = None,
                 rngs: nnx.Rngs | None = None, dtype=None, param_dtype=None, **kwargs):
        if depth not in DEPTHS:
            raise ValueError(f"model.depth must be one of {sorted(DEPTHS)}, got {depth}")
        if cnf is not None and cnf not in layers.CONNECTS:
            raise ValueError(f"model.cnf must be None (Spiking ResNet) or one of {layers.CONNECTS}, got {cnf!r}")
        if len(widths) != 4:
            raise ValueError(f"model.widths must give the 4 stages' widths, got {tuple(widths)}")
        name = f"{'sew' if cnf else 'spiking'}_resnet{depth}"
        for key, default in TORCH_DEFAULTS.items():
            value = kwargs.pop(key, default)
            if value != default and not (default is None and not any(value or ())):
                raise ValueError(f"{name}: {key}={value!r} is not supported (only SpikingJelly's default {default!r})")
        nrn = Neurons.of(spiking_neuron, kwargs, model=name, required=True)
        kw = dict(rngs=nnx.Rngs(0) if rngs is None else rngs, dtype=dtype, param_dtype=param_dtype)
        block, counts = DEPTHS[depth]
        if stage_blocks is not None:
            if len(stage_blocks) != 4 or min(stage_blocks) < 1:
                raise ValueError(f"model.stage_blocks must give 4 positive block counts, got {tuple(stage_blocks)}")
            counts = tuple(stage_blocks)
        self.depth, self.cnf = depth, cnf
        self.conv1 = _conv(in_channels, widths[0], 7, 2, ("embed", "embed"), kw)
        self.bn1, self.sn1 = _bn(widths[0], "embed", kw), nrn.make()
        cin = widths[0]
        for s, (planes, n) in enumerate(zip(widths, counts, strict=True)):
            blocks = []
            for b in range(n):
                stride = 2 if s > 0 and b == 0 else 1
                blocks.append(ResidualBlock(cin, planes, stride, block, cnf, nrn, zero_init_residual, kw))
                cin = planes * (4 if block == "bottleneck" else 1)
            setattr(self, f"layer{s + 1}", nnx.List(blocks))
        self.fc = layers.linear(cin, num_classes, axes=("embed", "classes"), **kw)

    def stages(self) -> list[nnx.List]:
        """``[layer1, layer2, layer3, layer4]``."""
        return [self.layer1, self.layer2, self.layer3, self.layer4]

    def units(self) -> list[Unit]:
        """The stem, every residual block (``layer{s}.{b}``), then the head (``AvgPool -> Linear``)."""
        out = [remat.unit(self, "stem", ("conv1", "bn1", "sn1"), self, _stem)]
        for s, stage in enumerate(self.stages()):
            out += [remat.unit(self, f"layer{s + 1}.{b}", (f"layer{s + 1}.{b}",), blk, _call)
                    for b, blk in enumerate(stage)]
        return out + [remat.unit(self, "head", ("fc",), self.fc, _head)]

    def spike_inputs(self) -> list[tuple[nnx.Module, str]]:
        """The convs that consume spikes (``snnjax.models.remat``): inside a block binary spikes; a block's
        input is binary too except SEW ``ADD``'s stream (a sum of spike tensors: small integers)."""
        stream = "counts" if self.cnf == "ADD" else "binary"
        out = []
        for stage in self.stages():
            for blk in stage:
                convs = blk.convs()
                out.append((convs[0], stream))
                out += [(c, "binary") for c in convs[1:-1]]
                last = convs[-1]
                out.append((last, stream if blk.has_downsample else "binary"))
        return out

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [T, N, H, W, C_in]`` -> logits ``[T, N, num_classes]``."""
        return run_units(self.units(), x)


def _call(module: nnx.Module, x: jax.Array) -> jax.Array:
    return module(x)


def _stem(model: ResNet, x: jax.Array) -> jax.Array:
    if x.ndim != 5:
        raise ValueError(f"{type(model).__name__} takes [T, N, H, W, C] input, got shape {x.shape}")
    return layers.max_pool2d(model.sn1(model.bn1(model.conv1(x))), 3, 2, 1)


def _head(fc: nnx.Module, x: jax.Array) -> jax.Array:
    return fc(jnp.mean(x, axis=(-3, -2)))


def _resnet(depth: int, cnf: str | None, pretrained: bool, spiking_neuron, kwargs: dict, sew: bool = False) -> ResNet:
    if pretrained:
        raise ValueError("pretrained=True: snnjax downloads no weights; load SpikingJelly's with "
                         "snnjax.interop.spikingjelly.import_state_dict(model, state_dict)")
    if sew and cnf is None:
        raise ValueError(f"sew_resnet{depth} needs cnf, the connect function: one of {layers.CONNECTS}")
    return ResNet(depth=depth, cnf=cnf, spiking_neuron=spiking_neuron, **kwargs)


def spiking_resnet18(pretrained: bool = False, progress: bool = True,
                     spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> ResNet:
    """SpikingJelly's ``spiking_resnet18``: ``kwargs`` are ``ResNet``'s keywords and the neuron keywords."""
    return _resnet(18, None, pretrained, spiking_neuron, kwargs)


def spiking_resnet34(pretrained: bool = False, progress: bool = True,
                     spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> ResNet:
    """SpikingJelly's ``spiking_resnet34`` (see ``spiking_resnet18``)."""
    return _resnet(34, None, pretrained, spiking_neuron, kwargs)


def spiking_resnet50(pretrained: bool = False, progress: bool = True,
                     spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> ResNet:
    """SpikingJelly's ``spiking_resnet50`` (see ``spiking_resnet18``)."""
    return _resnet(50, None, pretrained, spiking_neuron, kwargs)


def sew_resnet18(pretrained: bool = False, progress: bool = True, cnf: str | None = None,
                 spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> ResNet:
    """SpikingJelly's ``sew_resnet18`` with connect function ``cnf`` (``ADD``, ``AND``, ``IAND``; required)."""
    return _resnet(18, cnf, pretrained, spiking_neuron, kwargs, sew=True)


def sew_resnet34(pretrained: bool = False, progress: bool = True, cnf: str | None = None,
                 spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> ResNet:
    """SpikingJelly's ``sew_resnet34`` (see ``sew_resnet18``)."""
    return _resnet(34, cnf, pretrained, spiking_neuron, kwargs, sew=True)


def sew_resnet50(pretrained: bool = False, progress: bool = True, cnf: str | None = None,
                 spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> ResNet:
    """SpikingJelly's ``sew_resnet50`` (see ``sew_resnet18``)."""
    return _resnet(50, cnf, pretrained, spiking_neuron, kwargs, sew=True)


def _sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
    return {"in_channels": image_frame(data, "resnet")[2], "num_classes": data.num_classes}


for _depth in DEPTHS:
    register(f"spiking_resnet{_depth}", ResNet, _sizes, ("in_channels", "num_classes"), {"depth": _depth, "cnf": None},
             {"stage_blocks": tuple})
    register(f"sew_resnet{_depth}", ResNet, _sizes, ("in_channels", "num_classes"), {"depth": _depth, "cnf": "ADD"},
             {"stage_blocks": tuple})

# SpikingJelly's spiking_resnet and sew_resnet keys (one table: the same module names).
register_rules(ResNet, [
    Rule(r"conv1", "conv1", "conv"),
    Rule(r"bn1", "bn1", "bn"),
    Rule(r"sn1", "sn1", "neuron"),
    Rule(r"fc", "fc", "linear"),
    Rule(r"(layer[1-4])\.(\d+)\.(conv[1-3])", "{1}.{2}.{3}", "conv"),
    Rule(r"(layer[1-4])\.(\d+)\.(bn[1-3])", "{1}.{2}.{3}", "bn"),
    Rule(r"(layer[1-4])\.(\d+)\.(sn[1-3]|downsample_sn)", "{1}.{2}.{3}", "neuron"),
    Rule(r"(layer[1-4])\.(\d+)\.downsample\.0", "{1}.{2}.downsample_conv", "conv"),
    Rule(r"(layer[1-4])\.(\d+)\.downsample\.1", "{1}.{2}.downsample_bn", "bn"),
])
