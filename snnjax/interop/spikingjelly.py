"""Import a SpikingJelly (PyTorch) ``state_dict`` into any snnjax model: ``import_state_dict``, the one importer.

A ``state_dict`` is any mapping from torch key to numpy array (``np.load`` of an ``.npz``, or
``{k: v.numpy() for k, v in torch.load(...).items()}``). A zoo model's keys are located through its family's
rule table (declared in its model file with ``snnjax.models.registry.register_rules``, picked by the model's
class); any other model's (a ``snnjax.Sequential``, your own) layer by layer
(``snnjax.interop.layers.layer_locator``: ``prefixes``, ``rules``). One policy for both: every variable of the
model must be given, and every key must land on one (keys with no counterpart are refused unless
``allow_unused=True``); a key's array must fit its variable.
Refused imports load nothing and name the key, variable or shape.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np
from flax import nnx

from snnjax.interop import layers, rules
from snnjax.interop.layers import ImportReport, LayerRule, Locate, Path


def locator(model: nnx.Module, prefixes: Mapping[str, Path] | None = None,
            layer_rules: Mapping[str, LayerRule] | None = None) -> Locate:
    """The zoo family's table for a zoo model, else (or with ``prefixes`` / ``layer_rules``) layer by layer."""
    table = rules.locator(model) if prefixes is None and layer_rules is None else None
    return table or layers.layer_locator(model, prefixes, layer_rules)


def convert_state_dict(model: nnx.Module, state_dict: Mapping[str, np.ndarray]) -> dict[Path, np.ndarray]:
    """Torch-keyed arrays -> ``{snnjax path: array in snnjax layout}`` (parameters, statistics or their gradients).

    Raises:
      KeyError: a key with no counterpart, or one naming a variable the model lacks (another depth or neuron).
      ValueError: a key whose array does not fit the model's variable (another width or head count).
    """
    return layers.convert(model, state_dict, locator(model))[0]


def import_state_dict(model: nnx.Module, state_dict: Mapping[str, np.ndarray], *, allow_unused: bool = False,
                      prefixes: Mapping[str, Path] | None = None, rules: Mapping[str, LayerRule] | None = None,
                      dtype=None) -> ImportReport:
    """Load a SpikingJelly ``state_dict`` into ``model`` in place (parameters, BatchNorm statistics, PLIF ``w``);
    returns the report (``snnjax.interop.layers.ImportReport``: each key -> variable, ignored and unused keys, casts).

    ``allow_unused``: import although some keys have no counterpart in the model (they are listed in the report's
    ``leftover``). ``prefixes`` (``{torch prefix: snnjax module path}``) and ``rules`` (``{torch prefix:
    LayerRule}``) locate the keys of a model that is not in the zoo, or override a zoo model's table
    (``snnjax.interop.layers.layer_locator``). ``dtype``: the variables' dtype (``jnp.float64`` keeps a float64
    checkpoint exact; it needs ``jax.config.update("jax_enable_x64", True)`` first); default each variable's own,
    and a float64 state_dict cast to float32 warns.

    Raises:
      KeyError: keys with no counterpart (without ``allow_unused``), a key naming a variable the model lacks, or a
        variable of ``model`` not provided (the message holds the report). Nothing is loaded then.
      ValueError: a key whose array does not fit its variable (another width).
    """
    values, report = layers.convert(model, state_dict, locator(model, prefixes, rules), allow_unused=allow_unused,
                                    dtype=dtype)
    name = type(model).__name__
    if report.missing:
        raise KeyError(f"the state_dict does not provide {len(report.missing)} of this {name}'s variables, e.g. "
                       f"{report.missing[:5]}: the checkpoint has fewer blocks, another neuron (PLIF's w), or is for "
                       f"another architecture; nothing was loaded:\n{report}")
    cast = next((i for i in report.imported if i.note), None)
    if dtype is None and cast is not None:
        warnings.warn(f"the state_dict is {np.asarray(state_dict[cast.key]).dtype} and {name}'s variables are "
                      f"{cast.dtype}: importing rounds them (outputs then differ from SpikingJelly's float64 ones by "
                      "~1e-7); pass dtype=jnp.float64 (with jax_enable_x64) to keep float64", stacklevel=2)
    layers.assign(model, values, dtype)
    return report

