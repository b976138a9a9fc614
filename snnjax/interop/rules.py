"""A zoo family's rule table applied: a SpikingJelly key -> (snnjax variable, layout converter).

Each family declares its table in its model file (``snnjax.models.registry.register_rules``): a list of
``Rule``, a regular expression that must match a torch key's module prefix (everything before the last dot), the
snnjax module path it maps to (a template whose ``{1}``, ``{2}``, ... or ``{name}`` fields are the expression's
groups), and the layer ``kind``, which names the ``LayerRule`` (``snnjax.interop.layers``, ``KINDS`` here) that
renames the parameters and converts their layout:

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
lacks, has no counterpart (the importer refuses it unless told, ``snnjax.interop.spikingjelly``). A model's
table is its class's (or nearest registered base class's), a function of the model (its depth, pools, ...).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from flax import nnx

from snnjax.interop import layers
from snnjax.interop.layers import LayerRule, Locate, Path
from snnjax.models.registry import Rule, import_table

# Kind (each of ``snnjax.models.registry.RULE_KINDS``) -> its LayerRule, a function of the model (flat_linear's
# permutes by ``model.feature_shape``, (H, W, C)).
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
    table = import_table(model)
    return None if table is None else (lambda key: locate(table, model, key))
