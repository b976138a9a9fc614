"""IF / LIF / PLIF neurons with SpikingJelly's semantics: the base every implementation shares.

For each step t, with ``vr = v_reset if v_reset is not None else 0``:
  charge  IF:   H = V + X
          LIF:  H = V + (X - (V - vr)) / tau         (decay_input=True)
                H = V - (V - vr) / tau + X           (decay_input=False)
          PLIF: as LIF with 1/tau = k = sigmoid(w), w a learned scalar
  fire    S = 1[H >= v_threshold], backward via the surrogate sg'(H - v_threshold): the surrogate's call
          at H - v_threshold (its ``derivative`` in the backward), which for a surrogate with
          spiking=False or MultiLevelSpikeCount is not a 0/1 step (SpikingJelly's neurons take those too)
  reset   hard: V = S v_reset + (1 - S) H;  soft (v_reset=None): V = H - S v_threshold
          (S detached from the graph when detach_reset)

Shapes: multi-step inputs are time-major ``[T, ...]`` with any trailing shape;
the state ``V`` has the trailing shape. The state is kept in
``state_dtype(x.dtype)`` (float32 for bfloat16/float16 inputs); spikes and input
gradients come back in the input dtype.

This module is the base every implementation shares: the configuration, the
equations (``charge``, ``reset``, one ``step``), the factors of the reverse
recurrence (``dv_dh``, ``dx_from_dh``, ``plif_dw``) and ``multistep_reference``,
the multi-step forward differentiated by plain autodiff (the reference in tests).
The implementations of the multi-step neuron (``snnjax.neurons.kernels.xla``, the Pallas
kernels of ``snnjax.neurons.kernels.pallas``, the C++ kernels of ``snnjax.neurons.kernels.native``) import only this
module; ``snnjax.neurons.kernels.dispatch`` chooses between them.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp

from snnjax.neurons import surrogate as sg

Kind = Literal["IF", "LIF", "PLIF"]


@dataclasses.dataclass(frozen=True)
class NeuronConfig:
    """Static hyperparameters of a neuron (hashable, so usable as a jit-static argument).

    ``tau`` is used by LIF only; PLIF's time constant is the learned ``w`` passed
    separately. ``v_reset=None`` selects soft reset.
    """

    kind: Kind = "LIF"
    tau: float = 2.0
    decay_input: bool = True
    v_threshold: float = 1.0
    v_reset: float | None = 0.0
    detach_reset: bool = False
    surrogate: sg.Surrogate = sg.Sigmoid()

    def __post_init__(self):
        if self.kind not in ("IF", "LIF", "PLIF"):
            raise ValueError(f"neuron kind must be 'IF', 'LIF' or 'PLIF', got {self.kind!r}")
        if self.kind == "LIF" and not self.tau > 1.0:
            raise ValueError(f"LIF needs tau > 1 (SpikingJelly's requirement), got tau={self.tau}")
        sg.refuse_random(self.surrogate, f"the {self.kind} neuron")

    @property
    def vr(self) -> float:
        """The reset potential as a number (0 for soft reset)."""
        return 0.0 if self.v_reset is None else float(self.v_reset)


@dataclasses.dataclass(frozen=True)
class StepNeuron:
    """A neuron given by its single step, the form of every neuron without fused kernels (those of
    ``snnjax.neurons.catalogue`` and any a user writes): its multi-step op is ``scan_steps`` over ``step``.

    ``step(x [...], state, params) -> (out [...], state)`` with ``state`` a dict of ``[...]`` arrays in the state
    dtype (``"v"`` the membrane potential) and ``params`` the neuron's learnable arrays (a pytree); ``fresh``
    is ``((name, initial value), ...)``, ``"v"`` first; ``name`` is what errors call the neuron;
    ``params_like`` the params pytree with ``jax.ShapeDtypeStruct`` leaves (None: no params), with which the
    fused kernels trace the step on a few lanes of neurons (so it must be elementwise over the neurons).
    ``linear``: None, or ``linear(params) -> (a, b)`` declaring that the step is the linear recurrence without
    reset ``V_t = a V_{t-1} + b X_t`` whose output is ``V_t`` (``a``, ``b`` scalars or arrays broadcastable to
    ``[...]``, functions of the params so their gradients reach them); the ``assoc`` path
    (``snnjax.neurons.kernels.assoc``) runs such a neuron by an associative scan over time.
    """

    step: Callable
    fresh: tuple[tuple[str, float], ...]
    name: str
    params_like: Any = dataclasses.field(default=None, compare=False)
    linear: Callable | None = dataclasses.field(default=None, compare=False)

    @property
    def names(self) -> tuple[str, ...]:
        """The state variables' names, ``"v"`` first."""
        return tuple(name for name, _ in self.fresh)

    def flat_step(self) -> tuple[Callable, Any]:
        """``(step(x, states, params) -> (out, states), treedef)``: the step on lists (the states in ``names``
        order, the params' leaves in ``params_like``'s order; ``treedef`` rebuilds the params), the form the
        kernels generated from the step trace."""
        names = self.names
        treedef = jax.tree.structure(self.params_like)

        def step(x, states, params):
            out, new = self.step(x, dict(zip(names, states, strict=True)), jax.tree.unflatten(treedef, params))
            if set(new) != set(names):
                raise ValueError(f"{self.name}'s step returns the state variables {sorted(new)}, not {list(names)}")
            return out, [new[n] for n in names]

        return step, treedef


def per_neuron():
    """The context in which the kernels generated from a step trace it and its VJP (``kernels.native.codegen``,
    ``kernels.pallas.step``): no mesh. The step acts on each neuron alone; traced under a layout's mesh context,
    its VJP would carry the mesh's ``reshard`` ops, which no per-neuron kernel computes."""
    return jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ()))


def as_step_neuron(cfg: NeuronConfig, w=None) -> StepNeuron:
    """IF / LIF / PLIF written as a step neuron (``charge``, ``fire``, ``reset``; params ``step_params(cfg, w)``):
    the form the kernels generated from a step run, equal to ``step`` bit for bit."""
    def one_step(x, state, params):
        h = charge(cfg, state["v"], x, params.get("w"))
        s = fire(cfg, h)
        return s, {"v": reset(cfg, h, jax.lax.stop_gradient(s) if cfg.detach_reset else s)}

    like = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), step_params(cfg, w))
    return StepNeuron(one_step, (("v", cfg.vr),), cfg.kind, like)


def step_params(cfg: NeuronConfig, w) -> dict:
    """The params pytree of ``as_step_neuron(cfg)``: ``{"w": w}`` for PLIF, ``{}`` otherwise."""
    return {"w": jnp.asarray(w).reshape(())} if cfg.kind == "PLIF" else {}


def state_dtype(dtype) -> jnp.dtype:
    """Dtype of the membrane potential for inputs of ``dtype``: at least float32."""
    return jnp.promote_types(dtype, jnp.float32)


def check_decay_param(cfg: NeuronConfig, w) -> None:
    """PLIF needs a scalar ``w`` (one learned time constant per layer, as in SpikingJelly); others need none."""
    if cfg.kind == "PLIF":
        if w is None:
            raise ValueError("PLIF needs its learned parameter w (1/tau = sigmoid(w)); got w=None")
        if jnp.size(w) != 1:
            raise ValueError(f"PLIF's w must be a scalar (one time constant per layer), got shape {jnp.shape(w)}")


def decay_rate(cfg: NeuronConfig, w: jax.Array | None):
    """``k = 1/tau`` (a Python float for LIF, ``sigmoid(w)`` for PLIF, None for IF)."""
    if cfg.kind == "IF":
        return None
    if cfg.kind == "LIF":
        return 1.0 / cfg.tau
    if w is None:
        raise ValueError("PLIF needs its learned parameter w")
    return jax.nn.sigmoid(w)


def plif_dw(cfg: NeuronConfig, w: jax.Array, dk) -> jax.Array | None:
    """PLIF's dL/dw from dL/dk (k = sigmoid(w)), in w's dtype and shape; None for IF / LIF."""
    if cfg.kind != "PLIF":
        return None
    k = decay_rate(cfg, w)
    return (dk * k * (1.0 - k)).astype(jnp.asarray(w).dtype).reshape(jnp.shape(w))


def charge(cfg: NeuronConfig, v: jax.Array, x: jax.Array, w: jax.Array | None, *, k=None) -> jax.Array:
    """H from the previous state V and input X (SpikingJelly's exact operation order).

    PLIF's ``k = 1/tau`` is ``sigmoid(w)`` cast to V's dtype unless given as ``k`` (the
    Pallas kernels pass that same value in, so both paths round identically).
    """
    if cfg.kind == "IF":
        return v + x
    if cfg.kind == "LIF":
        scale = lambda d: d / cfg.tau  # noqa: E731
        keep = 1.0 - 1.0 / cfg.tau
    else:
        k = jax.nn.sigmoid(w).astype(v.dtype) if k is None else k
        scale = lambda d: d * k  # noqa: E731
        keep = 1.0 - k
    reset0 = cfg.v_reset is None or cfg.v_reset == 0.0
    if cfg.decay_input:
        return v + scale(x - v) if reset0 else v + scale(x - (v - cfg.v_reset))
    return v * keep + x if reset0 else v - scale(v - cfg.v_reset) + x


def reset_potential(h: jax.Array, s: jax.Array, v_threshold: float, v_reset: float | None) -> jax.Array:
    """V after firing, from H and spikes S (S already detached if wanted): hard reset to ``v_reset``, or soft
    (``v_reset=None``): ``H - S v_threshold``."""
    if v_reset is None:
        return h - s * v_threshold
    return (1.0 - s) * h + s * v_reset


def reset(cfg: NeuronConfig, h: jax.Array, s: jax.Array) -> jax.Array:
    """V after firing, from H and spikes S (S already detached if wanted)."""
    return reset_potential(h, s, cfg.v_threshold, cfg.v_reset)


def fire(cfg: NeuronConfig, h: jax.Array) -> jax.Array:
    """S from H: the surrogate's call at ``H - v_threshold`` (the step ``1[H >= v_threshold]`` when it is
    ``heaviside``), differentiable through the surrogate; in H's dtype."""
    return cfg.surrogate(h - cfg.v_threshold)


def fire_grad(cfg: NeuronConfig, h: jax.Array) -> jax.Array:
    """dS/dH: the surrogate's ``derivative`` at ``H - v_threshold`` (``sg'`` for a spiking surrogate)."""
    return cfg.surrogate.derivative(h - cfg.v_threshold)


def step(cfg: NeuronConfig, x: jax.Array, v: jax.Array, w: jax.Array | None = None):
    """One time step, differentiable by autodiff through the surrogate.

    Args: ``x`` input current ``[...]``; ``v`` state broadcastable to ``x``.
    Returns: ``(spikes [...] in x.dtype, new state [...] in state dtype)``.
    """
    check_decay_param(cfg, w)
    sdt = state_dtype(x.dtype)
    h = charge(cfg, v.astype(sdt), x.astype(sdt), w)
    s = fire(cfg, h)
    v_new = reset(cfg, h, jax.lax.stop_gradient(s) if cfg.detach_reset else s)
    return s.astype(x.dtype), v_new


def initial_state(cfg: NeuronConfig, shape, dtype) -> jax.Array:
    """Fresh membrane potential (``v_reset``, or 0 for soft reset) of ``shape``."""
    return jnp.full(shape, cfg.vr, state_dtype(dtype))


def start_states(neuron: StepNeuron, x_seq: jax.Array, v_init=None) -> dict[str, jax.Array]:
    """The start state ``{name: [...]}`` for ``x_seq [T, ...]`` in the state dtype: ``v_init`` (the membrane
    potential, or a dict of some or all state variables, anything broadcastable), the rest fresh."""
    sdt = state_dtype(x_seq.dtype)
    given = v_init if isinstance(v_init, dict) else ({} if v_init is None else {"v": v_init})
    names = [name for name, _ in neuron.fresh]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(f"v_init names state variables {unknown} that {neuron.name} does not have (it has {names})")
    return {name: jnp.broadcast_to(jnp.asarray(given.get(name, fresh), sdt), x_seq.shape[1:])
            for name, fresh in neuron.fresh}


def broadcast_state(cfg: NeuronConfig, x_seq: jax.Array, v_init) -> jax.Array:
    """The start state for ``x_seq [T, ...]``: ``v_init`` (anything broadcastable) or the fresh state, ``[...]``."""
    sdt = state_dtype(x_seq.dtype)
    if v_init is None:
        return initial_state(cfg, x_seq.shape[1:], x_seq.dtype)
    return jnp.broadcast_to(jnp.asarray(v_init, sdt), x_seq.shape[1:])


def scan_steps(step_fn: Callable, x_seq: jax.Array, state0, *, return_v_seq: bool = False):
    """Any neuron over ``x_seq [T, ...]``: ``lax.scan`` of its single step, differentiated by plain autodiff.

    ``step_fn(x [...], state) -> (out [...], state)``; ``state0`` is a pytree of ``[...]`` arrays whose
    membrane potential is ``state0`` itself (an array) or ``state0["v"]`` (a dict of state variables).
    Returns ``(outs [T, ...], v)``: ``v`` the membrane potential sequence ``[T, ...]`` if ``return_v_seq``,
    else the final state (the pytree of ``state0``).
    """
    def body(state, x):
        out, state = step_fn(x, state)
        v = state["v"] if isinstance(state, dict) else state
        return state, (out, v if return_v_seq else None)

    last, (outs, v_seq) = jax.lax.scan(body, state0, x_seq)
    return outs, (v_seq if return_v_seq else last)


def multistep_reference(cfg: NeuronConfig, x_seq: jax.Array, v_init=None, w=None, *, return_v_seq=False):
    """Plain-autodiff multi-step neuron (the reference for the custom-vjp path): ``scan_steps`` of ``step``.

    Returns ``(spikes [T, ...], v)`` where ``v`` is the state sequence ``[T, ...]`` if
    ``return_v_seq`` else the final state ``[...]``.
    """
    check_decay_param(cfg, w)
    v0 = broadcast_state(cfg, x_seq, v_init)
    return scan_steps(lambda x, v: step(cfg, x, v, w), x_seq, v0, return_v_seq=return_v_seq)


def dv_dh(cfg: NeuronConfig, h, s, g):
    """dV_t/dH_t for the reset mode."""
    if cfg.v_reset is not None:
        return 1.0 - s if cfg.detach_reset else (cfg.v_reset - h) * g + 1.0 - s
    return jnp.ones_like(h) if cfg.detach_reset else 1.0 - cfg.v_threshold * g


def dx_from_dh(cfg: NeuronConfig, dh: jax.Array, k) -> jax.Array:
    """dX_t from dH_t: ``dH/dX`` is ``1/tau`` for LIF and ``k`` for PLIF with ``decay_input``, else 1."""
    if cfg.kind == "LIF" and cfg.decay_input:
        return dh / cfg.tau
    if cfg.kind == "PLIF" and cfg.decay_input:
        return dh * k
    return dh
