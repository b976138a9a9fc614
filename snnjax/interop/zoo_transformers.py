"""SpikingJelly ``state_dict`` -> snnjax for the zoo's transformers, as rule tables.

``SpikeDrivenTransformer`` (SpikingJelly's ``spike_driven_transformer``) and ``QKFormer``
(``qkformer``). Each family is a table of :class:`Rule`: a regular expression over the torch
key without its last name (``weight``, ``running_mean``, ...), the snnjax module path it names
(``{group}`` fields filled from the match) and the kind of layer, which gives the parameter
names and the layout conversion:

=========  =====================================================================================
``conv``   Conv2d ``[O, I, kh, kw] -> [kh, kw, I, O]``; ``weight`` -> ``kernel``, ``bias``
``dense``  Linear ``[O, I]``, Conv1d ``[O, I, 1]`` or 1x1 Conv2d ``[O, I, 1, 1]`` -> ``[I, O]``, then
           reshaped to the model's head-split kernel (``[D, (2|3,) heads, head_dim]``,
           ``[heads, head_dim, D]``: torch's channel order is head-major)
``bn``     BatchNorm ``weight/bias/running_mean/running_var`` -> ``scale/bias/mean/var`` (reshaped
           like ``dense``); ``num_batches_tracked`` carries nothing
``neuron`` a parametric neuron's ``w`` (PLIF); other neurons have no keys
=========  =====================================================================================

Every key must match a rule and land on a variable of the model with the same number of
values, and every variable of the model must be given: a checkpoint of another architecture,
depth or width stops with an error naming the key or variable. Every conversion is a
permutation, so the same tables map torch gradients.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from snnjax.models.qkformer import QKFormer
from snnjax.models.sdt import SpikeDrivenTransformer

Path = tuple

_PARAMS = {
    "conv": {"weight": "kernel", "bias": "bias"},
    "dense": {"weight": "kernel", "bias": "bias"},
    "bn": {"weight": "scale", "bias": "bias", "running_mean": "mean", "running_var": "var",
           "num_batches_tracked": None},
    "neuron": {"w": "w"},
}


@dataclasses.dataclass(frozen=True)
class Rule:
    """Torch keys ``pattern.<name>`` -> snnjax ``target.<name'>``, converted as ``kind`` (module docstring)."""

    pattern: str
    target: str
    kind: str


_I = r"(?P<i>\d+)"
SDT_RULES = (
    Rule(rf"patch_embed\.stages\.{_I}\.0", "stages.{i}.conv", "conv"),
    Rule(rf"patch_embed\.stages\.{_I}\.1", "stages.{i}.bn", "bn"),
    Rule(rf"patch_embed\.stages\.{_I}\.2", "stages.{i}.lif", "neuron"),
    Rule(r"patch_embed\.final_stage\.0", "final.conv", "conv"),
    Rule(r"patch_embed\.final_stage\.1", "final.bn", "bn"),
    Rule(r"patch_embed\.final_lif", "final.lif", "neuron"),
    Rule(r"patch_embed\.rpe_conv", "final.rpe_conv", "conv"),
    Rule(r"patch_embed\.rpe_bn", "final.rpe_bn", "bn"),
    Rule(rf"blocks\.{_I}\.attn\.(?P<p>q|k|v|proj)_conv", "blocks.{i}.attn.{p}.fc", "dense"),
    Rule(rf"blocks\.{_I}\.attn\.(?P<p>q|k|v|proj)_bn", "blocks.{i}.attn.{p}.bn", "bn"),
    Rule(rf"blocks\.{_I}\.attn\.(?P<n>shortcut|q|k|v|attn)_lif", "blocks.{i}.attn.{n}_lif", "neuron"),
    Rule(rf"blocks\.{_I}\.mlp\.fc(?P<j>[12])", "blocks.{i}.mlp.fc{j}.fc", "dense"),
    Rule(rf"blocks\.{_I}\.mlp\.bn(?P<j>[12])", "blocks.{i}.mlp.fc{j}.bn", "bn"),
    Rule(rf"blocks\.{_I}\.mlp\.lif(?P<j>[12])", "blocks.{i}.mlp.lif{j}", "neuron"),
    Rule(r"head_lif", "head_lif", "neuron"),
    Rule(r"head", "head", "dense"),
)

_E = r"patch_embed(?P<s>[123])"
_B = r"stage(?P<s>[123])\.(?P<i>\d+)"
QKFORMER_RULES = (
    Rule(rf"{_E}\.conv(?P<j>[123])", "patch_embed{s}.conv{j}.conv", "conv"),
    Rule(rf"{_E}\.bn(?P<j>[123])", "patch_embed{s}.conv{j}.bn", "bn"),
    Rule(rf"{_E}\.lif(?P<j>[123])", "patch_embed{s}.lif{j}", "neuron"),
    Rule(rf"{_E}\.shortcut\.0", "patch_embed{s}.shortcut.conv", "conv"),
    Rule(rf"{_E}\.shortcut\.1", "patch_embed{s}.shortcut.bn", "bn"),
    Rule(rf"{_E}\.shortcut\.2", "patch_embed{s}.shortcut_lif", "neuron"),
    Rule(rf"{_B}\.attn\.(?P<p>qkv|qk|proj)_conv_bn\.0", "stage{s}.{i}.attn.{p}.fc", "dense"),
    Rule(rf"{_B}\.attn\.(?P<p>qkv|qk|proj)_conv_bn\.1", "stage{s}.{i}.attn.{p}.bn", "bn"),
    Rule(rf"{_B}\.attn\.(?P<n>qkv|qk|attn|proj)_lif", "stage{s}.{i}.attn.{n}_lif", "neuron"),
    Rule(rf"{_B}\.mlp\.fc(?P<j>[12])", "stage{s}.{i}.mlp.fc{j}.fc", "dense"),
    Rule(rf"{_B}\.mlp\.bn(?P<j>[12])", "stage{s}.{i}.mlp.fc{j}.bn", "bn"),
    Rule(rf"{_B}\.mlp\.lif(?P<j>[12])", "stage{s}.{i}.mlp.lif{j}", "neuron"),
    Rule(r"head", "head", "dense"),
)

TABLES: dict[type, tuple[Rule, ...]] = {SpikeDrivenTransformer: SDT_RULES, QKFormer: QKFORMER_RULES}


def rules_for(model: nnx.Module) -> tuple[Rule, ...]:
    """The rule table of ``model``'s family."""
    for cls, table in TABLES.items():
        if isinstance(model, cls):
            return table
    raise TypeError(f"no transformer rule table for {type(model).__name__}; "
                    f"supported: {', '.join(c.__name__ for c in TABLES)}")


def _layout(kind: str, arr: np.ndarray) -> np.ndarray:
    if kind == "conv" and arr.ndim == 4:
        return arr.transpose(2, 3, 1, 0)
    if kind == "dense" and arr.ndim >= 2:
        return arr.reshape(arr.shape[:2]).T
    return arr


def _variables(model: nnx.Module) -> dict[str, tuple[Path, nnx.Variable]]:
    flat = nnx.to_flat_state(nnx.state(model, (nnx.Param, nnx.BatchStat)))
    return {".".join(map(str, p)): (p, v) for p, v in flat}


def _target(rules: tuple[Rule, ...], key: str, model_name: str) -> tuple[str, str] | None:
    """``(snnjax dotted path, kind)`` of torch ``key`` (None: nothing to import)."""
    module, _, name = key.rpartition(".")
    for rule in rules:
        if m := re.fullmatch(rule.pattern, module):
            params = _PARAMS[rule.kind]
            if name not in params:
                raise KeyError(f"SpikingJelly key {key!r}: a {rule.kind} layer has no parameter {name!r} "
                               f"(expected one of {sorted(params)})")
            if params[name] is None:
                return None
            return rule.target.format(**m.groupdict()) + "." + params[name], rule.kind
    raise KeyError(f"SpikingJelly key {key!r} has no counterpart in {model_name}; is this checkpoint for a "
                   "different architecture?")


def convert_state_dict(model: nnx.Module, state_dict: Mapping[str, np.ndarray]) -> dict[Path, np.ndarray]:
    """Torch-keyed arrays -> ``{snnjax path: array in snnjax layout}`` (no key may be left unmatched).

    Raises:
      KeyError: a key no rule matches, or one naming a layer the model lacks (another depth).
      ValueError: a key whose array does not fit the model's variable (another width or head count).
    """
    rules, variables, name = rules_for(model), _variables(model), type(model).__name__
    out = {}
    for key, arr in state_dict.items():
        found = _target(rules, key, name)
        if found is None:
            continue
        dotted, kind = found
        if dotted not in variables:
            raise KeyError(f"SpikingJelly key {key!r} maps to {dotted!r}, which this {name} does not have: the "
                           "checkpoint has more blocks, a parametric neuron (PLIF's w) or other layers; build the "
                           "model with the checkpoint's depths / spiking_neuron")
        path, var = variables[dotted]
        value = _layout(kind, np.asarray(arr))
        shape = tuple(var.shape)
        if value.shape != shape:
            if value.size != math.prod(shape) or kind not in ("dense", "bn"):
                raise ValueError(f"SpikingJelly key {key!r} has shape {tuple(np.shape(arr))}, but {dotted} of this "
                                 f"{name} is {shape}: the checkpoint has another width; build the model with its "
                                 "embed_dims / num_heads / mlp_ratio")
            value = value.reshape(shape)  # flat channels -> the head-split layout (same order)
        out[path] = value
    return out


def import_state_dict(model: nnx.Module, state_dict: Mapping[str, np.ndarray], *, dtype=None) -> None:
    """Load a SpikingJelly ``state_dict`` into ``model`` in place (parameters, BatchNorm statistics, PLIF ``w``).

    Every variable of ``model`` must be given. Values are cast to each variable's dtype unless ``dtype`` is given.
    """
    converted = convert_state_dict(model, state_dict)
    missing = sorted(d for d, (p, _) in _variables(model).items() if p not in converted)
    if missing:
        raise KeyError(f"the state_dict does not provide {len(missing)} of this {type(model).__name__}'s variables, "
                       f"e.g. {missing[:5]}: the checkpoint has fewer blocks, another neuron (PLIF's w), or is "
                       "for another architecture")
    for (path, var) in _variables(model).values():
        var.set_value(jnp.asarray(converted[path], dtype or var.get_value().dtype))
