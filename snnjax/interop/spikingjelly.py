"""Import SpikingJelly (PyTorch) weights into the zoo models, through their family's rule table.

A ``state_dict`` is any mapping from torch key to numpy array (``np.load`` of an ``.npz``, or
``{k: v.numpy() for k, v in torch.load(...).items()}``). ``snnjax.interop.rules.TABLES`` picks the
table by the model's class; the table's kinds convert the layouts (``snnjax.interop.rules``). Every key
must land on a variable of the model with its shape, and every variable must be given: a checkpoint of
another architecture, depth, width or neuron stops with an error naming the key or variable.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np
from flax import nnx

from snnjax.interop import layers, rules
from snnjax.interop.layers import ImportReport, Path


def convert_state_dict(model: nnx.Module, state_dict: Mapping[str, np.ndarray]) -> dict[Path, np.ndarray]:
    """Torch-keyed arrays -> ``{snnjax path: array in snnjax layout}`` (parameters, statistics or their gradients).

    Raises:
      TypeError: a model with no rule table.
      KeyError: a key no rule matches, or one naming a variable the model lacks (another depth or neuron).
      ValueError: a key whose array does not fit the model's variable (another width or head count).
    """
    return layers.convert(model, state_dict, rules.locator(model))[0]


def import_state_dict(model: nnx.Module, state_dict: Mapping[str, np.ndarray], *, dtype=None) -> ImportReport:
    """Load a SpikingJelly ``state_dict`` into ``model`` in place (parameters, BatchNorm statistics, PLIF ``w``);
    returns the report (``snnjax.interop.layers.ImportReport``).

    Every variable of ``model`` must be given, with matching shapes (errors as ``convert_state_dict``'s).
    Values are cast to each variable's current dtype unless ``dtype`` is given; a float64 state_dict cast to
    float32 warns (pass ``dtype=jnp.float64`` with ``jax_enable_x64``, or build the model with ``param_dtype``).
    """
    values, report = layers.convert(model, state_dict, rules.locator(model), dtype=dtype)
    name = type(model).__name__
    if report.missing:
        raise KeyError(f"the state_dict does not provide {len(report.missing)} of this {name}'s variables, e.g. "
                       f"{report.missing[:5]}: the checkpoint has fewer blocks, another neuron (PLIF's w), or is for "
                       "another architecture")
    cast = next((i for i in report.imported if i.note), None)
    if dtype is None and cast is not None:
        warnings.warn(f"the state_dict is {np.asarray(state_dict[cast.key]).dtype} and {name}'s variables are "
                      f"{cast.dtype}: importing rounds them (outputs then differ from SpikingJelly's float64 ones by "
                      "~1e-7); pass dtype=jnp.float64 (with jax_enable_x64) to keep float64", stacklevel=2)
    layers.assign(model, values, dtype)
    return report
