"""NNX variable trees as ``(path, variable)`` pairs: what analysis, planning and printing walk over."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx


def is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def path_str(path) -> str:
    """A pytree key path as a dotted string (``blocks.0.conv.kernel``), without a Variable's ``value``."""
    if path and getattr(path[-1], "name", None) == "value":
        path = path[:-1]
    parts = []
    for k in path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return ".".join(parts)


def value(var):
    """The array of a Variable (or ``var`` itself if it is an array)."""
    return var.get_value() if is_var(var) else var


def split_state(model_or_state):
    """``(params, model_state, opt_state)`` of a model, a TrainState or a parameter State (missing parts None)."""
    if isinstance(model_or_state, nnx.Module):
        _, params, _, rest = nnx.split(model_or_state, nnx.Param, nnx.RngState, ...)
        return params, rest, None
    if hasattr(model_or_state, "params") and hasattr(model_or_state, "opt_state"):
        return model_or_state.params, model_or_state.model_state, model_or_state.opt_state
    return model_or_state, None, None


def flat_vars(tree) -> list[tuple[str, Any]]:
    """``[(dotted path, Variable), ...]`` of every variable in ``tree`` (empty for None)."""
    if tree is None:
        return []
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_var)[0]
    return [(path_str(p), v) for p, v in leaves]


def owner(groups: Sequence[Sequence[str]], path: str) -> int:
    """The index of the group of path prefixes that owns ``path`` (e.g. a model unit's ``owns``).

    ValueError unless exactly one group does: every variable must belong to one unit.
    """
    hits = [i for i, prefixes in enumerate(groups) if any(path == p or path.startswith(p + ".") for p in prefixes)]
    if len(hits) != 1:
        raise ValueError(f"variable {path!r} is owned by {len(hits)} units ({hits}); each variable must belong to "
                         "exactly one unit (see the model's units())")
    return hits[0]


def fresh(tree):
    """``tree`` with new Variable objects at the current trace level (NNX forbids writing a Variable from an
    outer trace, e.g. BatchNorm statistics inside a ``jax.vjp`` or a loop body)."""
    return jax.tree.map(lambda v: v, tree)
