"""SpikingJelly's spiking VGG (``spiking_vgg11/13/16/19`` and their ``_bn`` variants), channels-last, time-major.

torchvision's VGG with spiking neurons: ``features`` follows ``cfg`` (a width: ``Conv3x3 (padding 1, bias) ->
[BatchNorm] -> neuron``; ``"M"``: ``MaxPool(2)``), then ``AdaptiveAvgPool(7, 7) -> flatten -> Linear(512 * 49,
4096) -> neuron -> Dropout -> Linear(4096, 4096) -> neuron -> Dropout -> Linear(4096, num_classes)``. The
dropouts (p 0.5) share their mask over time (SpikingJelly's ``layer.Dropout``). Input ``[T, N, H, W, C]``
(frames of at least 32 x 32 for the five poolings), logits ``[T, N, num_classes]`` per step, as SpikingJelly's
multi-step model returns them (its single-step model returns each step's ``[N, num_classes]``).

Constructors: SpikingJelly's ``spiking_vgg{11,13,16,19}[_bn](pretrained=False, progress=True, [norm_layer=None,]
spiking_neuron=..., **kwargs)``, each a ``SpikingVGG`` with its ``cfg``. ``spiking_neuron`` is required (a
``snnjax.neurons`` class or its name) and the neuron keywords in ``kwargs`` reach every neuron with that class's
defaults (``snnjax.models.neuron_options``); ``kwargs`` also take ``SpikingVGG``'s keywords. snnjax's additions:
``in_channels`` (SpikingJelly's takes 3), ``hidden_features`` (4096) and ``dropout`` (0.5); any last conv width
(SpikingJelly's classifier takes 512). Weights as SpikingJelly initialises them (``init_weights``): convs
Kaiming-normal (fan out), linear layers normal(0, 0.01), biases 0.

Variables: ``features.{j}`` is the ``j``-th conv block (``conv``, ``bn``, ``neuron``; its ``pools`` max poolings
follow it), the classifier ``fc1``, ``sn1``, ``fc2``, ``sn2``, ``fc3``; the flatten is ``[H, W, C]`` order (the
weight import permutes torch's ``[C, H, W]``). Units: each block, ``fc1`` (pool, flatten, ``fc1 -> sn1 ->
Dropout``), ``fc2`` and ``head``. Tensor parallelism: the convs alternate column- and row-parallel, ``fc1`` is
column-, ``fc2`` row-parallel.
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
from snnjax.neurons.modules import BaseNode
from snnjax.parallel.logical import alternate, constrain

_A = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
_B = (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
_D = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")
_E = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M")
CFGS = {11: _A, 13: _B, 16: _D, 19: _E}  # by depth (torchvision's configurations A, B, D, E)
POOLED_SIZE = (7, 7)  # the adaptive pool's output

# As SpikingJelly initialises (init_weights): torch's kaiming_normal_(mode="fan_out", nonlinearity="relu") for
# the convs, normal(0, 0.01) for the linear layers; otherwise torch's default kernels (kaiming_uniform, a=sqrt(5)).
_INITS = {True: (jax.nn.initializers.variance_scaling(2.0, "fan_out", "normal"), jax.nn.initializers.normal(0.01)),
          False: (jax.nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform"),) * 2}


class ConvBlock(nnx.Module):
    """``Conv3x3 (bias) -> [BatchNorm] -> neuron -> MaxPool(2)`` x ``pools`` on ``[T, N, H, W, C]``."""

    def __init__(self, cin: int, cout: int, batch_norm: bool, pools: int, neuron: BaseNode, axes: tuple[str, str],
                 init, kw: dict):
        self.conv = layers.conv2d(cin, cout, 3, padding=1, kernel_init=init, axes=axes, **kw)
        self.batch_norm, self.pools, self.row_parallel = batch_norm, pools, axes[1] != "mlp"
        if batch_norm:
            self.bn = layers.BatchNorm(cout, dtype=kw["dtype"], param_dtype=kw["param_dtype"], axes=axes[1:])
        self.neuron = neuron

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.conv(x)
        if self.row_parallel:  # whole channels after the partial sums; rows split under sequence parallelism
            y = constrain(y, ("time", "batch", "height", None, "embed"))
        y = self.neuron(self.bn(y) if self.batch_norm else y)
        for _ in range(self.pools):
            y = layers.max_pool2d(y, 2, 2)
        return y


class SpikingVGG(nnx.Module):
    """SpikingJelly's ``SpikingVGG``: ``cfg`` (widths and ``"M"`` poolings; SpikingJelly's ``cfgs`` are ``CFGS``),
    ``batch_norm``, ``num_classes``; ``norm_layer`` must be None (snnjax's BatchNorm); ``spiking_neuron`` (required)
    and ``**kwargs``, the neuron keywords, build every neuron. ``rngs``: default ``nnx.Rngs(0)``."""

    def __init__(self, cfg: Sequence[int | str] = _A, batch_norm: bool = False, norm_layer: None = None,
                 num_classes: int = 1000, init_weights: bool = True,
                 spiking_neuron: type[BaseNode] | str | None = None, *, in_channels: int = 3,
                 hidden_features: int = 4096, dropout: float = 0.5, rngs: nnx.Rngs | None = None, dtype=None,
                 param_dtype=None, **kwargs):
        cfg = tuple(cfg)
        if not cfg or not isinstance(cfg[0], int) or any(not (v == "M" or isinstance(v, int) and v > 0) for v in cfg):
            raise ValueError(f"model.cfg must be positive widths and 'M' (a max pooling), starting with a width; "
                             f"got {cfg}")
        if norm_layer is not None:
            raise ValueError(f"SpikingVGG: norm_layer={norm_layer!r} is not supported (only None: snnjax's "
                             "layers.BatchNorm)")
        nrn = Neurons.of(spiking_neuron, kwargs, model="SpikingVGG", required=True)
        kw = dict(rngs=nnx.Rngs(0) if rngs is None else rngs, dtype=dtype, param_dtype=param_dtype)
        conv_init, linear_init = _INITS[bool(init_weights)]
        self.cfg, self.batch_norm = cfg, batch_norm
        blocks, cin = [], in_channels
        for v in cfg:
            if v == "M":
                blocks[-1].pools += 1
                continue
            blocks.append(ConvBlock(cin, v, batch_norm, 0, nrn.make(), alternate(len(blocks)), conv_init, kw))
            cin = v
        self.features = nnx.List(blocks)
        self.feature_shape = (*POOLED_SIZE, cin)
        lin = dict(kernel_init=linear_init, **kw)
        self.fc1 = layers.linear(cin * POOLED_SIZE[0] * POOLED_SIZE[1], hidden_features, axes=("embed", "mlp"), **lin)
        self.sn1, self.dropout1 = nrn.make(), layers.dropout(dropout, share_over_time=True, rngs=kw["rngs"])
        self.fc2 = layers.linear(hidden_features, hidden_features, axes=("mlp", "embed"), **lin)
        self.sn2, self.dropout2 = nrn.make(), layers.dropout(dropout, share_over_time=True, rngs=kw["rngs"])
        self.fc3 = layers.linear(hidden_features, num_classes, axes=("embed", "classes"), **lin)

    def units(self) -> list[Unit]:
        """Each conv block (``features.{j}``), then ``fc1`` (pool, flatten, ``fc1 -> sn1 -> Dropout``), ``fc2``
        (``fc2 -> sn2 -> Dropout``) and ``head`` (``fc3``)."""
        out = [remat.unit(self, f"features.{j}", (f"features.{j}",), b, _call) for j, b in enumerate(self.features)]
        return out + [remat.unit(self, "fc1", ("fc1", "sn1", "dropout1"), self, _fc1),
                      remat.unit(self, "fc2", ("fc2", "sn2", "dropout2"), self, _fc2),
                      remat.unit(self, "head", ("fc3",), self.fc3, _call)]

    def spike_inputs(self) -> list[tuple[nnx.Module, str]]:
        """The layers that consume spikes (``snnjax.models.remat``): every conv after the first (binary spikes,
        max-pooled or not)."""
        return [(b.conv, "binary") for b in list(self.features)[1:]]

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [T, N, H, W, C_in]`` -> logits ``[T, N, num_classes]``."""
        if x.ndim != 5:
            raise ValueError(f"SpikingVGG takes [T, N, H, W, C] input, got shape {x.shape}")
        return run_units(self.units(), x)


def _call(module: nnx.Module, x: jax.Array) -> jax.Array:
    return module(x)


def _fc1(model: SpikingVGG, x: jax.Array) -> jax.Array:
    x = layers.flatten_features(layers.adaptive_avg_pool2d(x, POOLED_SIZE))
    return model.dropout1(model.sn1(model.fc1(x)))


def _fc2(model: SpikingVGG, x: jax.Array) -> jax.Array:
    return model.dropout2(model.sn2(model.fc2(x)))


def _vgg(depth: int, batch_norm: bool, pretrained: bool, norm_layer, spiking_neuron, kwargs: dict) -> SpikingVGG:
    if pretrained:
        raise ValueError("pretrained=True: snnjax downloads no weights; load SpikingJelly's with "
                         "snnjax.interop.spikingjelly.import_state_dict(model, state_dict)")
    return SpikingVGG(CFGS[depth], batch_norm, norm_layer, spiking_neuron=spiking_neuron, **kwargs)


def spiking_vgg11(pretrained: bool = False, progress: bool = True,
                  spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> SpikingVGG:
    """SpikingJelly's ``spiking_vgg11`` (configuration A): ``kwargs`` are ``SpikingVGG``'s and the neuron
    keywords."""
    return _vgg(11, False, pretrained, None, spiking_neuron, kwargs)


def spiking_vgg11_bn(pretrained: bool = False, progress: bool = True, norm_layer: None = None,
                     spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> SpikingVGG:
    """SpikingJelly's ``spiking_vgg11_bn``: ``spiking_vgg11`` with BatchNorm after every conv."""
    return _vgg(11, True, pretrained, norm_layer, spiking_neuron, kwargs)


def spiking_vgg13(pretrained: bool = False, progress: bool = True,
                  spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> SpikingVGG:
    """SpikingJelly's ``spiking_vgg13`` (configuration B; see ``spiking_vgg11``)."""
    return _vgg(13, False, pretrained, None, spiking_neuron, kwargs)


def spiking_vgg13_bn(pretrained: bool = False, progress: bool = True, norm_layer: None = None,
                     spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> SpikingVGG:
    """SpikingJelly's ``spiking_vgg13_bn`` (see ``spiking_vgg11_bn``)."""
    return _vgg(13, True, pretrained, norm_layer, spiking_neuron, kwargs)


def spiking_vgg16(pretrained: bool = False, progress: bool = True,
                  spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> SpikingVGG:
    """SpikingJelly's ``spiking_vgg16`` (configuration D; see ``spiking_vgg11``)."""
    return _vgg(16, False, pretrained, None, spiking_neuron, kwargs)


def spiking_vgg16_bn(pretrained: bool = False, progress: bool = True, norm_layer: None = None,
                     spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> SpikingVGG:
    """SpikingJelly's ``spiking_vgg16_bn`` (see ``spiking_vgg11_bn``)."""
    return _vgg(16, True, pretrained, norm_layer, spiking_neuron, kwargs)


def spiking_vgg19(pretrained: bool = False, progress: bool = True,
                  spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> SpikingVGG:
    """SpikingJelly's ``spiking_vgg19`` (configuration E; see ``spiking_vgg11``)."""
    return _vgg(19, False, pretrained, None, spiking_neuron, kwargs)


def spiking_vgg19_bn(pretrained: bool = False, progress: bool = True, norm_layer: None = None,
                     spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> SpikingVGG:
    """SpikingJelly's ``spiking_vgg19_bn`` (see ``spiking_vgg11_bn``)."""
    return _vgg(19, True, pretrained, norm_layer, spiking_neuron, kwargs)


def _sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
    h, w, c = image_frame(data, "spiking_vgg")
    min_size = 2 ** sum(v == "M" for v in options.get("cfg", _A))
    if min(h, w) < min_size:
        raise ValueError(f"model 'spiking_vgg' max-pools its frames down by {min_size}; the data gives {h}x{w}: "
                         f"choose frames of at least {min_size}x{min_size} (e.g. --config.data.options.size=32) "
                         "or fewer 'M' in model.cfg")
    return {"in_channels": c, "num_classes": data.num_classes}


for _depth, _cfg in CFGS.items():
    for _bn in (False, True):
        register(f"spiking_vgg{_depth}{'_bn' if _bn else ''}", SpikingVGG, _sizes, ("in_channels", "num_classes"),
                 {"cfg": _cfg, "batch_norm": _bn})


def _import_rules(model: SpikingVGG) -> list[Rule]:
    """SpikingJelly's keys: ``features`` holds ``Conv2d, [BatchNorm2d,] neuron`` per width of ``cfg`` and a
    ``MaxPool2d`` per ``"M"`` (conv block ``j`` here), ``classifier`` holds ``Linear, neuron, Dropout, Linear,
    neuron, Dropout, Linear``."""
    table, t, j, bn = [], 0, 0, model.batch_norm
    for v in model.cfg:
        if v == "M":
            t += 1
            continue
        table += [Rule(rf"features\.{t}", f"features.{j}.conv", "conv")]
        if bn:
            table += [Rule(rf"features\.{t + 1}", f"features.{j}.bn", "bn")]
        table += [Rule(rf"features\.{t + 1 + bn}", f"features.{j}.neuron", "neuron")]
        t, j = t + 2 + bn, j + 1
    return table + [Rule(r"classifier\.0", "fc1", "flat_linear"), Rule(r"classifier\.1", "sn1", "neuron"),
                    Rule(r"classifier\.3", "fc2", "linear"), Rule(r"classifier\.4", "sn2", "neuron"),
                    Rule(r"classifier\.6", "fc3", "linear")]


register_rules(SpikingVGG, _import_rules)
