"""Conversion rules as tables, one per model family: a SpikingJelly key -> (snnjax variable, layout converter).

A table is a list of :class:`Rule`: a regular expression that must match a torch key's module
prefix (everything before the last dot), the snnjax module path it maps to (a template whose
``{1}``, ``{2}``, ... or ``{name}`` fields are the expression's groups), and the layer ``kind``, which
names the ``LayerRule`` (``snnjax.interop.layers``) that renames the parameters and converts their layout:

===============  ==================================================  =============================
kind             torch parameter -> snnjax                           layout
===============  ==================================================  =============================
``conv``         ``weight`` -> ``kernel``, ``bias`` -> ``bias``     ``[O, I, kh, kw] -> [kh, kw, I, O]``
``linear``       ``weight`` -> ``kernel``, ``bias`` -> ``bias``     ``[out, in]`` (a Conv1d's ``[O, I, 1]``,
                                                                     a 1x1 Conv2d's) ``-> [in, out]``
``flat_linear``  as ``linear``, after a flatten of ``[C, H, W]``    input rows to ``[H, W, C]`` order
                                                                     (the model's ``feature_shape``)
``bn``           ``weight`` -> ``scale``, ``bias``, ``running_mean``  as is; ``num_batches_tracked``
                 -> ``mean``, ``running_var`` -> ``var``              carries nothing
``neuron``       ``w`` (PLIF's) -> ``w``                              as is
``ws_conv``,     as ``conv`` / ``linear``, and ``gain`` -> ``gain``  ``[O, 1, 1, 1]`` / ``[O, 1] -> [O]``
``ws_linear``
===============  ==================================================  =============================

A flat channel axis lands on a head-split variable as it is (torch's channel order is head-major):
a fused q/k/v kernel ``[D, 3D] -> [D, 3, heads, head_dim]``, its BatchNorm ``[3D] -> [3, heads, head_dim]``,
an output projection ``[D, D] -> [heads, head_dim, D]``. Every conversion is a permutation, so the
same tables map torch gradients.

The first rule whose expression matches wins; a key no rule matches, or a parameter name its kind
lacks, has no counterpart (the importer refuses it unless told, ``snnjax.interop.spikingjelly``). A
family is registered by its model class in ``TABLES``: a function of the model (its depth, pools, ...)
returning the table.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

from flax import nnx

from snnjax.interop import layers
from snnjax.interop.layers import LayerRule, Locate, Path
from snnjax.layers import WSConv2d, WSLinear
from snnjax.models import (
    CIFAR10DVSVGG,
    MSResNet,
    OTTTSpikingVGG,
    ParametricLIFNet,
    QKFormer,
    ResNet,
    SpikeDrivenTransformer,
    Spikformer,
    SpikingVGG,
)
from snnjax.neurons.modules import BaseNode

# Kind -> its LayerRule, a function of the model (flat_linear's permutes by ``model.feature_shape``, (H, W, C)).
KINDS: dict[str, Callable[[nnx.Module], LayerRule]] = {
    "conv": lambda m: layers.CONV,
    "linear": lambda m: layers.LINEAR,
    "flat_linear": lambda m: LayerRule({"weight": ("kernel", layers.flat_linear_weight(m.feature_shape)),
                                        "bias": ("bias", layers.identity)}),
    "bn": lambda m: layers.BATCHNORM,
    "ws_conv": lambda m: layers.WS_CONV,
    "ws_linear": lambda m: layers.WS_LINEAR,
    "neuron": lambda m: layers.NOTHING,  # every tensor is the neuron's attribute of that name (``locate``)
}


@dataclasses.dataclass(frozen=True)
class Rule:
    """torch module prefix ``pattern`` (a full match) -> snnjax module ``target`` (dotted template), of ``kind``."""

    pattern: str
    target: str
    kind: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"rule kind must be one of {tuple(KINDS)}, got {self.kind!r}")


def locate(table: Sequence[Rule], model: nnx.Module, key: str) -> tuple[Path, LayerRule] | None:
    """The snnjax module path and ``LayerRule`` of torch ``key`` under ``table``; None if it has none."""
    prefix, _, tensor = key.rpartition(".")
    for rule in table:
        if m := re.fullmatch(rule.pattern, prefix):
            path = tuple(rule.target.format(None, *m.groups(), **m.groupdict()).split("."))
            found = KINDS[rule.kind](model)
            if rule.kind == "neuron":  # a learned parameter (PLIF's w, KLIF's k): the attribute of that name
                found = LayerRule({tensor: (tensor, layers.identity)})
            if tensor in found.tensors or tensor in found.ignore:
                return path, found
            break
    return None


def locator(model: nnx.Module) -> Locate | None:
    """``key -> (module path, LayerRule)`` through the table of ``model``'s family; None for a model outside them."""
    for cls, family in TABLES.items():
        if isinstance(model, cls):
            table = family(model)
            return lambda key: locate(table, model, key)
    return None


# -- the tables of the model families ----------------------------------------------------------

def vgg(pools: Sequence[bool]) -> list[Rule]:
    """CIFAR10DVSVGG: block ``i``'s ``proj_bn`` Sequential holds ``[AvgPool2d,] Conv2d, BatchNorm`` (the pool
    where ``pools[i]``), then ``classifier`` holds ``[Dropout,] Linear``."""
    table = []
    for i, pool in enumerate(pools):
        table += [Rule(rf"features\.{i}\.proj_bn\.{int(pool)}", f"features.{i}.conv", "conv"),
                  Rule(rf"features\.{i}\.proj_bn\.{int(pool) + 1}", f"features.{i}.bn", "bn")]
    return table + [Rule(r"classifier\.\d+", "classifier", "flat_linear")]


def spiking_vgg(cfg: Sequence[int | str], batch_norm: bool) -> list[Rule]:
    """SpikingVGG: torch's ``features`` Sequential holds ``Conv2d, [BatchNorm2d,] neuron`` per width of ``cfg`` and
    a ``MaxPool2d`` per ``"M"`` (conv block ``j`` here), ``classifier`` holds ``Linear, neuron, Dropout, Linear,
    neuron, Dropout, Linear``."""
    table, t, j = [], 0, 0
    for v in cfg:
        if v == "M":
            t += 1
            continue
        table += [Rule(rf"features\.{t}", f"features.{j}.conv", "conv")]
        if batch_norm:
            table += [Rule(rf"features\.{t + 1}", f"features.{j}.bn", "bn")]
        table += [Rule(rf"features\.{t + 1 + batch_norm}", f"features.{j}.neuron", "neuron")]
        t, j = t + 2 + batch_norm, j + 1
    return table + [Rule(r"classifier\.0", "fc1", "flat_linear"), Rule(r"classifier\.1", "sn1", "neuron"),
                    Rule(r"classifier\.3", "fc2", "linear"), Rule(r"classifier\.4", "sn2", "neuron"),
                    Rule(r"classifier\.6", "fc3", "linear")]


def ottt_vgg(model: OTTTSpikingVGG) -> list[Rule]:
    """OTTTSpikingVGG: torch's ``features.{i}`` / ``classifier.{j}`` are layer ``i`` / ``num_features + j``
    (``model.sj_key``); each layer's kind by its type (the flatten is torch's order: linear layers as they are)."""
    table = []
    for i, layer in enumerate(model.layers):
        kind = ("ws_conv" if isinstance(layer, WSConv2d) else "conv" if isinstance(layer, nnx.Conv) else
                "ws_linear" if isinstance(layer, WSLinear) else "linear" if isinstance(layer, nnx.Linear) else
                "neuron" if isinstance(layer, BaseNode) else None)
        if kind is not None:
            table.append(Rule(re.escape(model.sj_key(i)), f"layers.{i}", kind))
    return table


SPIKFORMER = [
    Rule(r"patch_embed\.stages\.(\d+)\.conv_bn\.block\.0", "stages.{1}.conv", "conv"),
    Rule(r"patch_embed\.stages\.(\d+)\.conv_bn\.block\.1", "stages.{1}.bn", "bn"),
    Rule(r"patch_embed\.positional_encoding\.conv_bn\.block\.0", "positional_encoding.conv", "conv"),
    Rule(r"patch_embed\.positional_encoding\.conv_bn\.block\.1", "positional_encoding.bn", "bn"),
    Rule(r"blocks\.(\d+)\.attn\.(qkv|proj)_conv_bn\.0", "blocks.{1}.attn.{2}.fc", "linear"),
    Rule(r"blocks\.(\d+)\.attn\.(qkv|proj)_conv_bn\.1", "blocks.{1}.attn.{2}.bn", "bn"),
    Rule(r"blocks\.(\d+)\.mlp\.(fc[12])\.0", "blocks.{1}.mlp.{2}.fc", "linear"),
    Rule(r"blocks\.(\d+)\.mlp\.(fc[12])\.1", "blocks.{1}.mlp.{2}.bn", "bn"),
    Rule(r"patch_embed\.stages\.(\d+)\.neuron", "stages.{1}.neuron", "neuron"),
    Rule(r"patch_embed\.positional_encoding\.neuron", "positional_encoding.neuron", "neuron"),
    Rule(r"blocks\.(\d+)\.attn\.(qkv|attn|proj)_lif", "blocks.{1}.attn.{2}_lif", "neuron"),
    Rule(r"blocks\.(\d+)\.mlp\.(neuron[12])", "blocks.{1}.mlp.{2}", "neuron"),
    Rule(r"head", "head", "linear"),
]

RESNET = [
    Rule(r"conv1", "conv1", "conv"),
    Rule(r"bn1", "bn1", "bn"),
    Rule(r"sn1", "sn1", "neuron"),
    Rule(r"fc", "fc", "linear"),
    Rule(r"(layer[1-4])\.(\d+)\.(conv[1-3])", "{1}.{2}.{3}", "conv"),
    Rule(r"(layer[1-4])\.(\d+)\.(bn[1-3])", "{1}.{2}.{3}", "bn"),
    Rule(r"(layer[1-4])\.(\d+)\.(sn[1-3]|downsample_sn)", "{1}.{2}.{3}", "neuron"),
    Rule(r"(layer[1-4])\.(\d+)\.downsample\.0", "{1}.{2}.downsample_conv", "conv"),
    Rule(r"(layer[1-4])\.(\d+)\.downsample\.1", "{1}.{2}.downsample_bn", "bn"),
]


MS_RESNET = [  # MSResNet and MaxResNet (SpikingJelly's ms_resnet)
    Rule(r"stem\.0", "stem_conv", "conv"),
    Rule(r"stem\.1", "stem_bn", "bn"),
    Rule(r"(layer[1-4])\.(\d+)\.(conv[12])", "{1}.{2}.{3}", "conv"),
    Rule(r"(layer[1-4])\.(\d+)\.(bn[12])", "{1}.{2}.{3}", "bn"),
    Rule(r"(layer[1-4])\.(\d+)\.(spike[12])", "{1}.{2}.{3}", "neuron"),
    Rule(r"(layer[1-4])\.(\d+)\.downsample\.0", "{1}.{2}.downsample_conv", "conv"),
    Rule(r"(layer[1-4])\.(\d+)\.downsample\.1", "{1}.{2}.downsample_bn", "bn"),
    Rule(r"head_lif", "head_lif", "neuron"),
    Rule(r"head", "head", "linear"),
]


def parametric_lif_net(stages: int) -> list[Rule]:
    """The table of a parametric-LIF net with ``stages`` conv stages: torch's ``conv_fc`` Sequential holds
    ``Conv, BN, neuron, MaxPool`` per stage, then ``Flatten, Dropout, Linear, neuron, Dropout, Linear, neuron,
    VotingLayer``."""
    table = []
    for i in range(stages):
        table += [Rule(rf"conv_fc\.{4 * i}", f"features.{i}.conv", "conv"),
                  Rule(rf"conv_fc\.{4 * i + 1}", f"features.{i}.bn", "bn"),
                  Rule(rf"conv_fc\.{4 * i + 2}", f"features.{i}.neuron", "neuron")]
    head = 4 * stages
    return table + [Rule(rf"conv_fc\.{head + 2}", "fc1", "flat_linear"),
                    Rule(rf"conv_fc\.{head + 3}", "sn1", "neuron"),
                    Rule(rf"conv_fc\.{head + 5}", "fc2", "linear"),
                    Rule(rf"conv_fc\.{head + 6}", "sn2", "neuron")]


_I = r"(?P<i>\d+)"
SDT = [  # SpikingJelly's spike_driven_transformer; its 1x1 Conv2d / Conv1d projections are linear
    Rule(rf"patch_embed\.stages\.{_I}\.0", "stages.{i}.conv", "conv"),
    Rule(rf"patch_embed\.stages\.{_I}\.1", "stages.{i}.bn", "bn"),
    Rule(rf"patch_embed\.stages\.{_I}\.2", "stages.{i}.lif", "neuron"),
    Rule(r"patch_embed\.final_stage\.0", "final.conv", "conv"),
    Rule(r"patch_embed\.final_stage\.1", "final.bn", "bn"),
    Rule(r"patch_embed\.final_lif", "final.lif", "neuron"),
    Rule(r"patch_embed\.rpe_conv", "final.rpe_conv", "conv"),
    Rule(r"patch_embed\.rpe_bn", "final.rpe_bn", "bn"),
    Rule(rf"blocks\.{_I}\.attn\.(?P<p>q|k|v|proj)_conv", "blocks.{i}.attn.{p}.fc", "linear"),
    Rule(rf"blocks\.{_I}\.attn\.(?P<p>q|k|v|proj)_bn", "blocks.{i}.attn.{p}.bn", "bn"),
    Rule(rf"blocks\.{_I}\.attn\.(?P<n>shortcut|q|k|v|attn)_lif", "blocks.{i}.attn.{n}_lif", "neuron"),
    Rule(rf"blocks\.{_I}\.mlp\.fc(?P<j>[12])", "blocks.{i}.mlp.fc{j}.fc", "linear"),
    Rule(rf"blocks\.{_I}\.mlp\.bn(?P<j>[12])", "blocks.{i}.mlp.fc{j}.bn", "bn"),
    Rule(rf"blocks\.{_I}\.mlp\.lif(?P<j>[12])", "blocks.{i}.mlp.lif{j}", "neuron"),
    Rule(r"head_lif", "head_lif", "neuron"),
    Rule(r"head", "head", "linear"),
]

_E = r"patch_embed(?P<s>[123])"
_B = r"stage(?P<s>[123])\.(?P<i>\d+)"
QKFORMER = [  # SpikingJelly's qkformer
    Rule(rf"{_E}\.conv(?P<j>[123])", "patch_embed{s}.conv{j}.conv", "conv"),
    Rule(rf"{_E}\.bn(?P<j>[123])", "patch_embed{s}.conv{j}.bn", "bn"),
    Rule(rf"{_E}\.lif(?P<j>[123])", "patch_embed{s}.lif{j}", "neuron"),
    Rule(rf"{_E}\.shortcut\.0", "patch_embed{s}.shortcut.conv", "conv"),
    Rule(rf"{_E}\.shortcut\.1", "patch_embed{s}.shortcut.bn", "bn"),
    Rule(rf"{_E}\.shortcut\.2", "patch_embed{s}.shortcut_lif", "neuron"),
    Rule(rf"{_B}\.attn\.(?P<p>qkv|qk|proj)_conv_bn\.0", "stage{s}.{i}.attn.{p}.fc", "linear"),
    Rule(rf"{_B}\.attn\.(?P<p>qkv|qk|proj)_conv_bn\.1", "stage{s}.{i}.attn.{p}.bn", "bn"),
    Rule(rf"{_B}\.attn\.(?P<n>qkv|qk|attn|proj)_lif", "stage{s}.{i}.attn.{n}_lif", "neuron"),
    Rule(rf"{_B}\.mlp\.fc(?P<j>[12])", "stage{s}.{i}.mlp.fc{j}.fc", "linear"),
    Rule(rf"{_B}\.mlp\.bn(?P<j>[12])", "stage{s}.{i}.mlp.fc{j}.bn", "bn"),
    Rule(rf"{_B}\.mlp\.lif(?P<j>[12])", "stage{s}.{i}.mlp.lif{j}", "neuron"),
    Rule(r"head", "head", "linear"),
]

# Model class -> its family's table (a function of the model). SpikingJelly's classes: SpikingResNet and
# SEWResNet -> ResNet; DVSGestureNet, CIFAR10DVSNet, NMNISTNet -> ParametricLIFNet.
TABLES: dict[type, Callable[[nnx.Module], Sequence[Rule]]] = {
    CIFAR10DVSVGG: lambda m: vgg([block.pool for block in m.features]),
    Spikformer: lambda m: SPIKFORMER,
    ResNet: lambda m: RESNET,
    MSResNet: lambda m: MS_RESNET,  # MSResNet and MaxResNet
    ParametricLIFNet: lambda m: parametric_lif_net(len(m.features)),
    SpikeDrivenTransformer: lambda m: SDT,
    QKFormer: lambda m: QKFORMER,
    SpikingVGG: lambda m: spiking_vgg(m.cfg, m.batch_norm),
    OTTTSpikingVGG: ottt_vgg,
}
