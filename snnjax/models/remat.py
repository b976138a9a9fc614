"""Activation checkpointing per model unit and compressed spike residuals: a model's memory settings.

Policies (what the backward keeps of a unit; everything else is recomputed from it):

=================  ==========================================================================
``none``           everything autodiff keeps (no recomputation)
``units``          only the unit's input: the whole unit is recomputed (SpikingJelly's
                   checkpointed containers)
``dots_saveable``  the outputs of matmuls (``jax.checkpoint_policies.dots_saveable``)
``spikes``         only the spike tensors the unit's layers consume (the neuron outputs), stored
                   as ``spike_residuals`` says; convolutions, BatchNorm and neurons are recomputed
=================  ==========================================================================

``spike_residuals`` (``float``, ``int8``, ``bits``; ``snnjax.layers.residuals``) is how every layer
that consumes spikes keeps them: it applies under every policy (under ``none`` the layers after a
neuron keep int8 or bits instead of floats).

    configure(model, remat="spikes", spike_residuals="bits")
    configure(model, remat={"blocks.0": "units", "stages.0": "spikes"})   # per unit, the rest "none"

Settings are static attributes of the model (they are in its graphdef), so a step traced with a
configured model compiles with them. Checkpointing never changes the values computed: loss and
gradients equal ``none``'s.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping

import jax
from flax import nnx

from snnjax.layers.residuals import SPIKES, STORAGE, after, codec_for, set_input_codec
from snnjax.models.units import Unit
from snnjax.parallel import param_stream
from snnjax.parallel.variables import flat_vars

POLICIES = ("none", "units", "dots_saveable", "spikes")


@dataclasses.dataclass(frozen=True)
class MemorySettings:
    """A model's checkpoint policy per unit (``default`` for units not in ``per_unit``) and spike storage."""

    default: str = "none"
    per_unit: tuple[tuple[str, str], ...] = ()
    spike_residuals: str = "float"

    def __post_init__(self):
        for policy in (self.default, *(p for _, p in self.per_unit)):
            if policy not in POLICIES:
                raise ValueError(f"remat policy must be one of {POLICIES}, got {policy!r}")
        if self.spike_residuals not in STORAGE:
            raise ValueError(f"spike_residuals must be one of {STORAGE}, got {self.spike_residuals!r}")

    def policy(self, unit: str) -> str:
        """The policy of unit ``unit``."""
        return dict(self.per_unit).get(unit, self.default)

    def describe(self) -> str:
        """E.g. ``remat=spikes, spike_residuals=bits`` or ``remat=none (blocks.0: units), ...``."""
        per = ", ".join(f"{u}: {p}" for u, p in self.per_unit)
        return f"remat={self.default}{f' ({per})' if per else ''}, spike_residuals={self.spike_residuals}"


NONE = MemorySettings()


def settings(remat: str | Mapping[str, str] = "none", spike_residuals: str = "float") -> MemorySettings:
    """``MemorySettings`` from a policy name, or a mapping ``{unit name: policy}`` (other units ``none``)."""
    if isinstance(remat, str):
        return MemorySettings(remat, (), spike_residuals)
    return MemorySettings("none", tuple(sorted(dict(remat).items())), spike_residuals)


def jax_policy(policy: str) -> Callable | None:
    """The ``jax.checkpoint`` policy of ``policy`` (None for ``none``: no checkpoint)."""
    if policy not in POLICIES:
        raise ValueError(f"remat policy must be one of {POLICIES}, got {policy!r}")
    return {"none": None, "units": jax.checkpoint_policies.nothing_saveable,
            "dots_saveable": jax.checkpoint_policies.dots_saveable,
            "spikes": jax.checkpoint_policies.save_only_these_names(SPIKES)}[policy]


def configure(model: nnx.Module, remat: str | Mapping[str, str] | MemorySettings = "none",
              spike_residuals: str = "float") -> MemorySettings:
    """Set ``model``'s checkpoint policies and spike storage (in place); returns the settings.

    ``model`` defines ``units()`` (its unit names are checked) and ``spike_inputs()``: the layers that
    consume spike-valued tensors, each with what its input holds (``binary``, ``counts``, ``quarters``).
    """
    s = remat if isinstance(remat, MemorySettings) else settings(remat, spike_residuals)
    names = {u.name for u in model.units()}
    unknown = sorted({u for u, _ in s.per_unit} - names)
    if unknown:
        raise ValueError(f"remat names units {unknown} that {type(model).__name__} does not have; its units: "
                         f"{sorted(names)}")
    named = s.spike_residuals != "float" or "spikes" in (s.default, *(p for _, p in s.per_unit))
    for layer, values in model.spike_inputs():
        set_input_codec(layer, codec_for(s.spike_residuals, values) if named else None)
    model.remat_settings = s
    return s


def memory_settings(model: nnx.Module) -> MemorySettings:
    """The settings ``configure`` gave ``model`` (``NONE`` if never configured)."""
    return getattr(model, "remat_settings", NONE)


def unit(model: nnx.Module, name: str, owns: tuple[str, ...], module: nnx.Module,
         call: Callable[[nnx.Module, jax.Array], jax.Array]) -> Unit:
    """The ``Unit`` that runs ``call(module, x)`` under ``model``'s policy for ``name``.

    ``module`` holds every variable the unit reads or writes (``nnx.remat`` carries its state, so
    BatchNorm statistics and RNG counts are updated as without checkpointing).
    """
    policy = memory_settings(model).policy(name)
    placement_of = param_stream.active()
    if placement_of is not None:  # parameters in host memory: the unit fetches its own when it runs
        fetched = _owned_params(model, module, owns, placement_of)
        base = jax_policy(policy) or jax.checkpoint_policies.everything_saveable
        return Unit(name, owns, functools.partial(_streamed, name, call, param_stream.host_policy(base), module,
                                                  fetched))
    if policy == "none":
        return Unit(name, owns, lambda x: call(module, x))
    return Unit(name, owns, functools.partial(_checkpointed, call, jax_policy(policy), module))


def _owned_params(model: nnx.Module, module: nnx.Module, owns: tuple[str, ...],
                  placement_of: Callable[[str], param_stream.Placement]) -> dict[str, param_stream.Placement]:
    """``{path in module: placement}`` of the parameters of ``module`` that the unit ``owns`` (paths in ``model``)."""
    prefix = next((".".join(map(str, path)) for path, node in nnx.iter_graph(model) if node is module), None)
    if prefix is None:
        raise ValueError(f"unit {owns} of {type(model).__name__} runs a module that is not part of the model")
    out = {}
    for path, _ in flat_vars(nnx.state(module, nnx.Param)):
        full = f"{prefix}.{path}" if prefix else path
        if any(full == p or full.startswith(p + ".") for p in owns):
            out[path] = placement_of(full)
    return out


def _streamed(name, call, policy, module, fetched, x):
    """``call(module, x)`` with the parameters in ``fetched`` brought from host memory inside a checkpoint whose
    ``policy`` keeps nothing read from host memory (the backward fetches them again). Parameters of ``module``
    that the unit does not own stand in as shapes: a unit never reads another unit's variables."""
    graphdef, owned, others, rest = nnx.split(module, lambda path, v: _dotted(path) in fetched, nnx.Param, ...)
    others = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), others)

    def pure(state, x):
        owned, rest = state
        with jax.named_scope(param_stream.scope(name)):  # the transfers carry the unit's name
            owned = nnx.State.from_flat_path({k: v.replace(param_stream.fetch(v.get_value(), fetched[_dotted(k)]))
                                              for k, v in owned.flat_state()})
        m = nnx.merge(graphdef, owned, others, rest)
        y = call(m, x)
        return y, nnx.split(m, nnx.Param, ...)[2]

    y, new_rest = _recompute(pure, policy, (owned, rest), x)
    nnx.update(module, new_rest)
    return y


def _dotted(key: tuple) -> str:
    return ".".join(map(str, key))


def _checkpointed(call, policy, module, x):
    graphdef, state = nnx.split(module)

    def pure(state, x):
        m = nnx.merge(graphdef, state)  # Variables of this trace: BatchNorm may update its statistics
        y = call(m, x)
        return y, nnx.state(m)

    y, new_state = _recompute(pure, policy, state, x)
    nnx.update(module, new_state)
    return y


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _recompute(pure, policy, state, x):
    return pure(state, x)


def _recompute_fwd(pure, policy, state, x):
    return jax.vjp(jax.checkpoint(pure, policy=policy), state, x)


def _recompute_bwd(pure, policy, vjp_fn, ct):
    # The recomputation reads the kept values through an addition of 0 * (a cotangent element): it cannot
    # run before the backward reaches the unit, and XLA cannot merge it with the forward (XLA:CPU drops the
    # optimization barriers jax.checkpoint places, and would otherwise keep the forward's values instead).
    leaves, treedef = jax.tree.flatten(vjp_fn)
    return jax.tree.unflatten(treedef, after(leaves, ct))(ct)


_recompute.defvjp(_recompute_fwd, _recompute_bwd)
