"""Conversion rules as tables: a SpikingJelly ``state_dict`` key -> (snnjax variable path, layout converter).

A table is a list of :class:`Rule`: a regular expression that must match a torch key's module
prefix (everything before the last dot), the snnjax module path it maps to (a template whose
``{1}``, ``{2}``, ... are the expression's groups; numeric path parts become list indices), and the
layer ``kind``, which maps the parameter name and converts its layout:

===============  ==================================================  =============================
kind             torch parameter -> snnjax                           layout
===============  ==================================================  =============================
``conv``         ``weight`` -> ``kernel``, ``bias`` -> ``bias``     ``[O, I, kh, kw] -> [kh, kw, I, O]``
``linear``       ``weight`` -> ``kernel``, ``bias`` -> ``bias``     ``[out, in] -> [in, out]``
``flat_linear``  as ``linear``, after a flatten of ``[C, H, W]``    input rows to ``[H, W, C]`` order
``bn``           ``weight`` -> ``scale``, ``bias``, ``running_mean``  as is; ``num_batches_tracked``
                 -> ``mean``, ``running_var`` -> ``var``              carries nothing
``neuron``       ``w`` (PLIF's) -> ``w``                              as is
===============  ==================================================  =============================

The first rule whose expression matches wins; a key no rule matches raises ``KeyError``.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

import numpy as np

Path = tuple
Convert = Callable[[np.ndarray], np.ndarray]
KINDS = ("conv", "linear", "flat_linear", "bn", "neuron")

_BN_NAMES = {"weight": "scale", "bias": "bias", "running_mean": "mean", "running_var": "var"}


@dataclasses.dataclass(frozen=True)
class Rule:
    """torch module prefix ``pattern`` (a full match) -> snnjax module ``target`` (dotted template), of ``kind``."""

    pattern: str
    target: str
    kind: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"rule kind must be one of {KINDS}, got {self.kind!r}")


def _conv_weight(arr: np.ndarray) -> np.ndarray:
    if arr.ndim != 4:
        raise ValueError(f"a Conv2d weight is [O, I, kh, kw], got shape {arr.shape}")
    return arr.transpose(2, 3, 1, 0)


def _linear_weight(arr: np.ndarray) -> np.ndarray:
    if arr.ndim != 2:
        raise ValueError(f"a Linear weight is [out, in], got shape {arr.shape}")
    return arr.T


def _identity(arr: np.ndarray) -> np.ndarray:
    return arr


def flat_linear_weight(feature_shape: tuple[int, int, int], where: str) -> Convert:
    """``[out, C*H*W]`` (torch's flatten order) -> ``[H*W*C, out]`` for features ``feature_shape = (H, W, C)``."""
    h, w, c = feature_shape

    def convert(arr):
        if arr.ndim != 2 or arr.shape[1] != h * w * c:
            raise ValueError(f"shape mismatch at {where}: the model's features flatten to {c}x{h}x{w}={h * w * c}, "
                             f"the state_dict's layer takes {arr.shape[1:]}")
        return arr.reshape(arr.shape[0], c, h, w).transpose(2, 3, 1, 0).reshape(h * w * c, arr.shape[0])

    return convert


def _path(template: str, groups: Sequence[str]) -> Path:
    text = template.format(None, *groups)
    return tuple(int(p) if p.isdigit() else p for p in text.split("."))


def lookup(table: Sequence[Rule], key: str, feature_shape: tuple[int, int, int] | None = None
           ) -> tuple[Path, Convert] | None:
    """The snnjax path and converter of torch ``key`` under ``table`` (None: the key carries nothing to import).

    ``feature_shape``: ``(H, W, C)`` of the features a ``flat_linear`` rule's layer flattens.
    Raises ``KeyError`` if no rule matches or the parameter name is not one of its kind's.
    """
    module, _, name = key.rpartition(".")
    for rule in table:
        m = re.fullmatch(rule.pattern, module)
        if m is None:
            continue
        path = _path(rule.target, m.groups())
        if rule.kind == "bn":
            if name == "num_batches_tracked":
                return None
            if name in _BN_NAMES:
                return path + (_BN_NAMES[name],), _identity
        elif rule.kind == "neuron":
            if name == "w":
                return path + ("w",), _identity
        elif name == "bias":
            return path + ("bias",), _identity
        elif name == "weight":
            if rule.kind == "conv":
                return path + ("kernel",), _conv_weight
            if rule.kind == "linear":
                return path + ("kernel",), _linear_weight
            if feature_shape is None:
                raise ValueError(f"rule {rule.pattern!r} flattens features: give lookup() their feature_shape")
            return path + ("kernel",), flat_linear_weight(feature_shape, ".".join(map(str, path)) + ".kernel")
        raise KeyError(key)
    raise KeyError(key)


# -- the tables of the model families ----------------------------------------------------------

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
