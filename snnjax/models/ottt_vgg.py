"""SpikingJelly's OTTT VGG (``model/spiking_vggws_ottt.py``): ``OTTTSpikingVGG`` and its constructors
``ottt_spiking_vggws``, ``ottt_spiking_vgg{11,13,16,19}`` and their ``_ws`` variants, channels-last and time-major.

A ``Sequential`` (so online training hands ``(spike, trace)`` pairs through it as SpikingJelly's
``OTTTSequential``): ``features`` follows ``cfg`` (a width: ``Conv3x3 (padding 1, bias) -> neuron``, with weight
standardisation ``WSConv2d -> neuron -> Scale(2.74)``, then ``Dropout(drop_rate)`` if ``drop_rate > 0``;
``"M"`` ``MaxPool(2)``, ``"A"`` ``AvgPool(2)``); then the classifier: with ``light_classifier``
``AdaptiveAvgPool(fc_hw) -> flatten -> Linear(C fc_hw^2, num_classes)``, else ``AdaptiveAvgPool(7) -> flatten ->
[WS]Linear(C 49, 4096) -> neuron -> [Scale] -> Dropout -> [WS]Linear(4096, 4096) -> neuron -> [Scale] -> Dropout
-> Linear(4096, num_classes)``. Dropouts share their mask over time (SpikingJelly's ``layer.Dropout``); the
flatten is torch's ``[C, H, W]`` order. Input ``[T, N, H, W, C]``, logits ``[T, N, num_classes]``.

Keywords: SpikingJelly's (``cfg``, ``weight_standardization``, ``num_classes``, ``init_weights``,
``spiking_neuron``, ``light_classifier``, ``drop_rate``, ``fc_hw``; the constructors' ``spiking_neuron`` defaults to
``OTTTLIFNode``) and the neuron keywords in ``**kwargs`` (``snnjax.models.neuron_options``); snnjax's additions:
``in_channels`` (3), ``hidden_features`` (4096), and any last width (SpikingJelly's classifier takes 512).
Weights as SpikingJelly initialises them: convs Kaiming-normal (fan out), linear layers normal(0, 0.01), biases 0,
gains 1.

Layer ``i`` is ``layers.i``; SpikingJelly's ``features.{i}`` for ``i < num_features``, ``classifier.{i -
num_features}`` after (``sj_key``).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from flax import nnx

from snnjax import layers
from snnjax.models.neuron_options import Neurons
from snnjax.models.registry import DataShape, Rule, image_frame, register, register_rules
from snnjax.models.sequential import Sequential
from snnjax.models.spiking_vgg import _INITS
from snnjax.neurons.modules import BaseNode
from snnjax.neurons.online import OTTTLIFNode
from snnjax.parallel.logical import alternate

WS_SCALE = 2.74  # SpikingJelly's rescaling of spikes after weight-standardised layers
CFGS: dict[str, tuple] = {
    "A": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "B": (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "D": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    "E": (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"),
    "S": (64, 128, "A", 256, 256, "A", 512, 512, "A", 512, 512),
}


class OTTTSpikingVGG(Sequential):
    """SpikingJelly's ``OTTTSpikingVGG`` (see the module docstring); ``spiking_neuron`` is required (the constructors
    default it to ``OTTTLIFNode``). ``rngs``: default ``nnx.Rngs(0)``."""

    def __init__(self, cfg: Sequence[int | str] = CFGS["S"], weight_standardization: bool = True,
                 num_classes: int = 1000, init_weights: bool = True,
                 spiking_neuron: type[BaseNode] | str | None = None, light_classifier: bool = True,
                 drop_rate: float = 0.0, *, fc_hw: int = 1, in_channels: int = 3, hidden_features: int = 4096,
                 rngs: nnx.Rngs | None = None, dtype=None, param_dtype=None, **kwargs):
        cfg = tuple(cfg)
        if not cfg or not isinstance(cfg[0], int) or any(not (v in ("M", "A") or isinstance(v, int) and v > 0)
                                                         for v in cfg):
            raise ValueError(f"model.cfg must be positive widths, 'M' (max pooling) and 'A' (average pooling), "
                             f"starting with a width; got {cfg}")
        nrn = Neurons.of(spiking_neuron, kwargs, model="OTTTSpikingVGG", required=True)
        ws = bool(weight_standardization)
        kw = dict(rngs=nnx.Rngs(0) if rngs is None else rngs, dtype=dtype, param_dtype=param_dtype)
        conv_init, linear_init = _INITS[bool(init_weights)]
        features, cin, convs = [], in_channels, 0
        for v in cfg:
            if v in ("M", "A"):
                features.append(layers.MaxPool2d(2) if v == "M" else layers.AvgPool2d(2))
                continue
            features += [layers.conv2d(cin, v, 3, padding=1, kernel_init=conv_init, axes=alternate(convs),
                                       weight_standardization=ws, **kw), nrn.make()]
            features += [layers.Scale(WS_SCALE)] if ws else []
            features += [layers.dropout(drop_rate, share_over_time=True, rngs=kw["rngs"])] if drop_rate > 0 else []
            cin, convs = v, convs + 1
        lin = dict(kernel_init=linear_init, **kw)
        if light_classifier:
            head = [layers.AdaptiveAvgPool2d(fc_hw), layers.Flatten("chw"),
                    layers.linear(cin * fc_hw * fc_hw, num_classes, axes=("embed", "classes"), **lin)]
        else:
            scale = [layers.Scale(WS_SCALE if ws else 1.0)]
            head = [layers.AdaptiveAvgPool2d(7), layers.Flatten("chw"),
                    layers.linear(cin * 49, hidden_features, axes=("embed", "mlp"), weight_standardization=ws, **lin),
                    nrn.make(), *scale, layers.dropout(0.5, share_over_time=True, rngs=kw["rngs"]),
                    layers.linear(hidden_features, hidden_features, axes=("mlp", "embed"), weight_standardization=ws,
                                  **lin),
                    nrn.make(), *scale, layers.dropout(0.5, share_over_time=True, rngs=kw["rngs"]),
                    layers.linear(hidden_features, num_classes, axes=("embed", "classes"), **lin)]
        self.cfg, self.num_features = cfg, len(features)
        super().__init__(*features, *head)

    def sj_key(self, i: int) -> str:
        """SpikingJelly's module key of layer ``i`` (``features.{i}`` or ``classifier.{j}``)."""
        return f"features.{i}" if i < self.num_features else f"classifier.{i - self.num_features}"


def _vgg(cfg: str, ws: bool, light: bool, spiking_neuron, kwargs: dict) -> OTTTSpikingVGG:
    return OTTTSpikingVGG(CFGS[cfg], ws, spiking_neuron=spiking_neuron, **{"light_classifier": light, **kwargs})


def ottt_spiking_vggws(spiking_neuron: type[BaseNode] | str | None = OTTTLIFNode, **kwargs) -> OTTTSpikingVGG:
    """SpikingJelly's ``ottt_spiking_vggws``: configuration ``"S"``, weight-standardised, light classifier."""
    return _vgg("S", True, True, spiking_neuron, kwargs)


def ottt_spiking_vgg11(spiking_neuron=OTTTLIFNode, **kwargs) -> OTTTSpikingVGG:
    """SpikingJelly's ``ottt_spiking_vgg11`` (configuration A, no weight standardisation, full classifier)."""
    return _vgg("A", False, False, spiking_neuron, kwargs)


def ottt_spiking_vgg11_ws(spiking_neuron=OTTTLIFNode, **kwargs) -> OTTTSpikingVGG:
    """SpikingJelly's ``ottt_spiking_vgg11_ws`` (configuration A, weight-standardised, full classifier)."""
    return _vgg("A", True, False, spiking_neuron, kwargs)


def ottt_spiking_vgg13(spiking_neuron=OTTTLIFNode, **kwargs) -> OTTTSpikingVGG:
    """SpikingJelly's ``ottt_spiking_vgg13`` (configuration B; see ``ottt_spiking_vgg11``)."""
    return _vgg("B", False, False, spiking_neuron, kwargs)


def ottt_spiking_vgg13_ws(spiking_neuron=OTTTLIFNode, **kwargs) -> OTTTSpikingVGG:
    """SpikingJelly's ``ottt_spiking_vgg13_ws`` (configuration B; see ``ottt_spiking_vgg11_ws``)."""
    return _vgg("B", True, False, spiking_neuron, kwargs)


def ottt_spiking_vgg16(spiking_neuron=OTTTLIFNode, **kwargs) -> OTTTSpikingVGG:
    """SpikingJelly's ``ottt_spiking_vgg16`` (configuration D; see ``ottt_spiking_vgg11``)."""
    return _vgg("D", False, False, spiking_neuron, kwargs)


def ottt_spiking_vgg16_ws(spiking_neuron=OTTTLIFNode, **kwargs) -> OTTTSpikingVGG:
    """SpikingJelly's ``ottt_spiking_vgg16_ws`` (configuration D; see ``ottt_spiking_vgg11_ws``)."""
    return _vgg("D", True, False, spiking_neuron, kwargs)


def ottt_spiking_vgg19(spiking_neuron=OTTTLIFNode, **kwargs) -> OTTTSpikingVGG:
    """SpikingJelly's ``ottt_spiking_vgg19`` (configuration E; see ``ottt_spiking_vgg11``)."""
    return _vgg("E", False, False, spiking_neuron, kwargs)


def ottt_spiking_vgg19_ws(spiking_neuron=OTTTLIFNode, **kwargs) -> OTTTSpikingVGG:
    """SpikingJelly's ``ottt_spiking_vgg19_ws`` (configuration E; see ``ottt_spiking_vgg11_ws``)."""
    return _vgg("E", True, False, spiking_neuron, kwargs)


def _sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
    h, w, c = image_frame(data, "ottt_spiking_vggws")
    min_size = 2 ** sum(v in ("M", "A") for v in options.get("cfg", CFGS["S"]))
    if min(h, w) < min_size:
        raise ValueError(f"model 'ottt_spiking_vggws' pools its frames down by {min_size}; the data gives {h}x{w}: "
                         f"choose frames of at least {min_size}x{min_size} or fewer 'M' / 'A' in model.cfg")
    return {"in_channels": c, "num_classes": data.num_classes}


_PRESETS = {"ottt_spiking_vggws": ("S", True, True)}
for _depth, _cfg in (("11", "A"), ("13", "B"), ("16", "D"), ("19", "E")):
    _PRESETS[f"ottt_spiking_vgg{_depth}"] = (_cfg, False, False)
    _PRESETS[f"ottt_spiking_vgg{_depth}_ws"] = (_cfg, True, False)
for _name, (_cfg, _ws, _light) in _PRESETS.items():
    register(_name, OTTTSpikingVGG, _sizes, ("in_channels", "num_classes"),
             {"cfg": CFGS[_cfg], "weight_standardization": _ws, "light_classifier": _light,
              "spiking_neuron": "OTTTLIFNode", "v_reset": None})  # OTTTLIFNode's soft reset (configs default to 0.0)


def _import_rules(model: OTTTSpikingVGG) -> list[Rule]:
    """SpikingJelly's ``features.{i}`` / ``classifier.{j}`` are layer ``i`` / ``num_features + j`` (``sj_key``);
    each layer's kind by its type (the flatten is torch's order: linear layers as they are)."""
    table = []
    for i, layer in enumerate(model.layers):
        kind = ("ws_conv" if isinstance(layer, layers.WSConv2d) else "conv" if isinstance(layer, nnx.Conv) else
                "ws_linear" if isinstance(layer, layers.WSLinear) else "linear" if isinstance(layer, nnx.Linear)
                else "neuron" if isinstance(layer, BaseNode) else None)
        if kind is not None:
            table.append(Rule(re.escape(model.sj_key(i)), f"layers.{i}", kind))
    return table


register_rules(OTTTSpikingVGG, _import_rules)
