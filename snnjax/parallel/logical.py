"""Logical axis names on parameters and activations.

Every parameter carries a tuple of logical names, one per dimension, in its
``nnx.Variable`` metadata under ``logical_axes`` (read it with
``var.logical_axes`` or ``logical_axes(var)``; change it with
``annotate(var, ...)``). A strategy's rule table (``snnjax.parallel.rules``)
maps logical names to mesh axes. The names:

=========  ===========================================================================
batch      examples of the global batch (activations only)
time       time steps (activations only)
embed      a feature / channel dim tensor parallelism keeps whole: the input of a
           column-parallel layer, the output of a row-parallel one
mlp        a feature / channel dim tensor parallelism splits: the output of a
           column-parallel layer (and its BatchNorm, neurons), the input of a row-parallel one
heads      attention heads (split whole; a head's channels are never split)
head_dim   channels within one head (never split)
qkv        the query / key / value selector of a fused projection (never split)
window     a convolution window dimension (never split)
classes    classifier outputs
length     tokens of a sequence (activations only)
height     image rows (activations only; split by sequence parallelism)
=========  ===========================================================================

The names are plain metadata, not Flax's ``out_sharding`` (which would make
every variable creation need a mesh); nothing is sharded until a plan is applied.

The layout context
------------------
While a plan's step is traced, ``StepLayout.context()`` (``snnjax.parallel.layout``)
enters two contexts, and the code below reads them; nothing else in the model
code changes with the layout:

* this module's activation rules (``activation_rules``): ``constrain(x, names)``
  maps logical names onto the mesh (a no-op without rules, so the same model code
  runs unsharded, in tests and in notebooks); ``shards(name)`` tells
  ``layers.conv.Conv2d`` how ``[T, N]`` is split, so its merge keeps each device's block;
* JAX's own mesh context (``jax.sharding.use_abstract_mesh``), which
  ``snnjax.neurons.kernels.dispatch`` reads through ``jax.sharding.get_abstract_mesh()`` to
  choose the neuron implementation.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Mapping, Sequence

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from snnjax.parallel.rules import logical_spec

LOGICAL_AXES = ("batch", "time", "embed", "mlp", "heads", "head_dim", "qkv", "window", "classes", "length",
                "height")
ACTIVATION_AXES = ("batch", "time", "length", "height")  # the names that mark activations only
METADATA_KEY = "logical_axes"

Names = tuple  # tuple[str | None, ...]


def annotate(var: nnx.Variable, *names: str | None) -> nnx.Variable:
    """Set ``var``'s logical axis names (one per dimension; ``None``: no name). Returns ``var``."""
    shape = getattr(var, "shape", None)
    if shape is not None and len(names) != len(shape):
        raise ValueError(f"{len(names)} logical names {names} for a variable of shape {tuple(shape)}; "
                         "give exactly one name (or None) per dimension")
    unknown = [n for n in names if n is not None and not isinstance(n, str)]
    if unknown:
        raise TypeError(f"logical axis names must be strings or None, got {unknown}")
    unknown = [n for n in names if n is not None and n not in LOGICAL_AXES]
    if unknown:
        raise ValueError(f"unknown logical axis name(s) {unknown}; the rule tables know {list(LOGICAL_AXES)} "
                         "(snnjax.parallel.logical explains each)")
    var.set_metadata(METADATA_KEY, tuple(names))
    return var


def logical_axes(var) -> Names | None:
    """The logical names of a variable (``None`` if it has none)."""
    if isinstance(var, nnx.Variable):
        return var.get_metadata().get(METADATA_KEY)
    return None


def annotate_layer(layer: nnx.Module, kernel: Sequence[str | None], bias: Sequence[str | None] | None = None):
    """Name the ``kernel`` (and ``bias``, by default the kernel's last names) of a Linear / Conv layer."""
    annotate(layer.kernel, *kernel)
    if getattr(layer, "bias", None) is not None:
        out_dims = len(layer.bias.shape)
        annotate(layer.bias, *(tuple(bias) if bias is not None else tuple(kernel)[-out_dims:]))
    return layer


def alternate(i: int) -> tuple[str, str]:
    """``(in, out)`` names of the ``i``-th layer of a chain: even layers column-, odd layers row-parallel."""
    return ("embed", "mlp") if i % 2 == 0 else ("mlp", "embed")


# -- activation constraints ---------------------------------------------------------------------

_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("snnjax_activation_rules", default=None)


@contextlib.contextmanager
def activation_rules(mesh: Mesh, rules: Mapping[str, str | tuple[str, ...] | None]):
    """Within this context ``constrain`` maps logical names with ``rules`` onto ``mesh`` (used while tracing)."""
    token = _ACTIVE.set((mesh, dict(rules)))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_devices() -> int:
    """How many devices the active rules' mesh spans (1 where no rules are active)."""
    active = _ACTIVE.get()
    return 1 if active is None else active[0].size


def shards(name: str) -> int:
    """The number of devices the active rules (if any) split the logical axis ``name`` over."""
    active = _ACTIVE.get()
    if active is None:
        return 1
    mesh, rules = active
    axes = rules.get(name) or ()
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    return math.prod(mesh.shape[a] for a in axes)


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """``with_sharding_constraint`` of ``x`` to the active rules' layout for ``names`` (no-op without rules)."""
    active = _ACTIVE.get()
    if active is None:
        return x
    mesh, rules = active
    if len(names) != x.ndim:
        raise ValueError(f"constrain: {len(names)} names {tuple(names)} for an array of shape {x.shape}")
    spec, _ = logical_spec(names, x.shape, rules, dict(mesh.shape))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
