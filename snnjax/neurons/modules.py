"""Flax NNX spiking neuron modules with SpikingJelly's keyword names and defaults.

``step_mode='m'`` (multi-step) maps ``[T, ...] -> [T, ...]`` spikes and is pure:
every call starts from a fresh state (``v_reset``), so training needs no
``reset_net``; pass ``v_init`` to ``multi_step`` to continue from a given state.
``step_mode='s'`` (single-step) is the stateful streaming variant: the membrane
potential lives in a ``MembranePotential`` variable across calls until
``reset()`` (or ``reset_net(model)``). ``step(x, v)`` is the explicit-state
single step. With ``store_v_seq=True`` the multi-step state sequence is sown as an
``nnx.Intermediate`` named ``v_seq``; read it with ``nnx.capture(model, nnx.Intermediate)(x)``.
``impl`` (``"auto"``, ``"xla"``, ``"pallas"``, ``"native"``, ``"scan"``, ``"assoc"``) picks the multi-step
implementation (``snnjax.neurons.kernels.dispatch``); it can be changed on a built model (``node.impl = "pallas"``).
Within ``observe(fn)`` every neuron call also hands ``(neuron, spikes, v)`` to ``fn`` (``v`` the state
sequence in multi-step mode): ``snnjax.monitor`` reads firing rates and membrane potentials this way,
without any change to the model's code.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax.neurons import base as B
from snnjax.neurons import surrogate as sg
from snnjax.neurons.kernels import dispatch

_OBSERVER: contextvars.ContextVar = contextvars.ContextVar("snnjax_neuron_observer", default=None)


@contextlib.contextmanager
def observe(fn: Callable[[nnx.Module, jax.Array, jax.Array], None]):
    """Within this context every neuron call also calls ``fn(neuron, spikes, v)`` (``v``: ``[T, ...]`` in
    multi-step mode, the new state in single-step mode). Used while tracing by ``snnjax.monitor`` and
    ``snnjax.deploy``. Contexts nest: an enclosing one's ``fn`` is called too."""
    outer = _OBSERVER.get()
    token = _OBSERVER.set(fn if outer is None else lambda *seen: (outer(*seen), fn(*seen)))
    try:
        yield
    finally:
        _OBSERVER.reset(token)


class MembranePotential(nnx.Variable):
    """Streaming neuron state (single-step mode); filter with ``nnx.state(model, MembranePotential)``."""


class Stateful:
    """A module with single-step state (SpikingJelly's ``MemoryModule``): its ``reset()`` forgets it, and
    ``reset_net`` calls that on every such module."""


class BaseNode(nnx.Module, Stateful):
    """Every spiking neuron: a single step written as SpikingJelly writes one (charge, fire, reset), and the machinery
    around it (single- and multi-step modes, streaming state, ``store_v_seq``, ``impl``, observers).

    A neuron is a subclass that sets its keywords before ``super().__init__`` and overrides:

    - ``neuronal_charge(x, v, params) -> h``: H from the input ``x [...]`` and the state before the step. ``v`` is
      the membrane potential; a neuron with more state variables (``initial_state``) gets and returns the dict of
      all of them, ``"v"`` holding H;
    - optionally ``neuronal_fire(h, params)`` (default: the surrogate's call at ``H - v_threshold``, the spike
      ``1[H >= v_threshold]`` for a spiking surrogate) and
      ``neuronal_reset(h, spike, params)`` (default: hard reset to ``v_reset``, soft for ``v_reset=None``,
      ``spike`` detached with ``detach_reset``), both on the state dict;
    - optionally ``initial_state()`` (``{"v": v_reset or 0}`` by default: more names add state variables);
    - optionally ``linear_recurrence(params) -> (a, b)``, declaring that the step (V its only state, output the new
      V) is ``V_t = a V_{t-1} + b X_t``: then ``impl="assoc"`` runs it by an associative scan over time.

    ``params``: the module's ``nnx.Param`` arrays by attribute name (``self.k = nnx.Param(...)`` is
    ``params["k"]``, and ``self.k[...]`` the same value). States are in ``state_dtype`` (at least float32). The
    multi-step mode scans the single step (``impl="scan"``) or runs the native CPU kernel generated from it
    (``impl="native"``, what ``auto`` picks on a CPU where the step can be generated); the built-in IF / LIF /
    PLIF (``kind`` set) are written the same way and also run on the hand-written kernels of
    ``snnjax.neurons.kernels``.
    """

    kind: B.Kind | None = None  # the built-in neurons with fused kernels: their NeuronConfig's kind

    def __init__(
        self,
        v_threshold: float = 1.0,
        v_reset: float | None = 0.0,
        surrogate_function: sg.Surrogate = sg.Sigmoid(),
        detach_reset: bool = False,
        step_mode: str = "s",
        store_v_seq: bool = False,
        impl: str = "auto",
    ):
        if impl not in dispatch.IMPLS:
            raise ValueError(f"impl must be one of {dispatch.IMPLS}, got {impl!r}")
        if step_mode not in ("s", "m"):
            raise ValueError(f"step_mode must be 's' (single-step) or 'm' (multi-step), got {step_mode!r}")
        sg.refuse_random(surrogate_function, type(self).__name__)
        self.v_threshold = v_threshold
        self.v_reset = v_reset
        self.surrogate_function = surrogate_function
        self.detach_reset = detach_reset
        self.step_mode = step_mode
        self.store_v_seq = store_v_seq
        self.impl = impl
        for name, value in self._fresh_state().items():
            setattr(self, name, MembranePotential(value))

    # --- the single step: what a neuron overrides ---------------------------------------------------------

    def initial_state(self) -> dict[str, float]:
        """Each state variable's fresh value, ``"v"`` (the membrane potential) first."""
        return {"v": 0.0 if self.v_reset is None else self.v_reset}

    def neuronal_charge(self, x: jax.Array, v, params: dict):
        """H from input ``x [...]`` and the state (see the class docstring)."""
        raise NotImplementedError(f"{type(self).__name__} must define neuronal_charge(x, v, params) -> h")

    def neuronal_fire(self, h: dict, params: dict) -> jax.Array:
        """The output of the step: the surrogate's call at ``H - v_threshold`` (the spike ``1[H >= v_threshold]`` for
        a spiking surrogate; its primitive with ``spiking=False``; counts for ``MultiLevelSpikeCount``)."""
        return self.surrogate_function(h["v"] - self.v_threshold)

    def neuronal_reset(self, h: dict, spike: jax.Array, params: dict) -> dict:
        """The state after the step: hard (``v_reset``) or soft (``None``) reset of the membrane potential."""
        s = jax.lax.stop_gradient(spike) if self.detach_reset else spike
        return {**h, "v": B.reset_potential(h["v"], s, self.v_threshold, self.v_reset)}

    def linear_recurrence(self, params: dict) -> tuple | None:
        """``(a, b)`` where the step is the linear recurrence without reset ``V_t = a V_{t-1} + b X_t`` and outputs
        ``V_t`` (``a``, ``b`` scalars or arrays broadcastable to the neurons' shape, computed from ``params`` so
        that learnable ones get gradients); None (the default): it is not. The declaration is the neuron's
        promise: ``impl="assoc"`` runs it instead of the step (``snnjax.neurons.kernels.assoc``)."""
        del params
        return None

    def declares_linear(self) -> bool:
        """Whether ``linear_recurrence`` declares this neuron's step linear: it returns ``(a, b)``, and no hook of the
        step is overridden in a subclass of the class that defines it (a subclass that changes the charge of a
        declared neuron is not taken to be linear)."""
        def owner(name):
            return next(c for c in type(self).__mro__ if name in vars(c))

        declaring = owner("linear_recurrence")
        hooks = ("neuronal_charge", "neuronal_fire", "neuronal_reset", "initial_state", "single_step")
        return (declaring is not BaseNode and all(issubclass(declaring, owner(h)) for h in hooks)
                and self.linear_recurrence(self.params()) is not None)

    def single_step(self, x: jax.Array, state: dict, params: dict) -> tuple[jax.Array, dict]:
        """One pure step on the state dict (state dtype): ``(output [...], state)``."""
        multi = len(state) > 1
        h = self.neuronal_charge(x, state if multi else state["v"], params)
        h = h if multi else {"v": h}
        spike = self.neuronal_fire(h, params)
        return spike, self.neuronal_reset(h, spike, params)

    def param_names(self) -> tuple[str, ...]:
        """The names of the ``nnx.Param`` attributes (SpikingJelly's parameter names: PLIF's ``w``, KLIF's ``k``)."""
        return tuple(sorted(name for name, var in vars(self).items() if isinstance(var, nnx.Param)))

    def params(self) -> dict[str, jax.Array]:
        """The learnable arrays: every ``nnx.Param`` attribute's value, by name."""
        return {name: getattr(self, name)[...] for name in self.param_names()}

    # --- around the step ---------------------------------------------------------------------------------

    def _fresh_state(self) -> dict[str, jax.Array]:
        # The default float dtype: float64 under jax_enable_x64, so v_reset is not rounded to float32.
        return {name: jnp.asarray(value, dtype=float) for name, value in self.initial_state().items()}

    # Built-in neurons override these two.
    def _config_kwargs(self) -> dict:
        return {}

    def decay_param(self) -> jax.Array | None:
        return None

    @property
    def config(self) -> B.NeuronConfig | None:
        """The static hyperparameters of a built-in neuron as a ``NeuronConfig`` (None for any other neuron)."""
        if self.kind is None:
            return None
        return B.NeuronConfig(
            kind=self.kind,
            v_threshold=self.v_threshold,
            v_reset=self.v_reset,
            detach_reset=self.detach_reset,
            surrogate=self.surrogate_function,
            **self._config_kwargs(),
        )

    @property
    def neuron(self) -> B.NeuronConfig | B.StepNeuron:
        """What the multi-step op runs: a built-in neuron's ``NeuronConfig``, else its single step."""
        return self.config if self.kind is not None else self._step_neuron()[0]

    def _step_neuron(self) -> tuple[B.StepNeuron, nnx.State]:
        """The single step as a pure function of ``(x, state, params)`` and the params it takes: the module's
        ``nnx.Param`` state, merged back into a copy of the module inside the step, so that a hook reading
        ``self.k`` sees the traced value too (and its gradient flows)."""
        graphdef, params, rest = nnx.split(self, nnx.Param, ...)

        def step(x, state, params):
            node = nnx.merge(graphdef, params, rest)
            return node.single_step(x, state, node.params())

        def linear(params):
            node = nnx.merge(graphdef, params, rest)
            return node.linear_recurrence(node.params())

        like = jax.tree.map(lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)), params)
        declared = self.declares_linear()
        return B.StepNeuron(step, tuple(self.initial_state().items()), type(self).__name__, like,
                            linear if declared else None), params

    def __call__(self, x: jax.Array) -> jax.Array:
        """Outputs (spikes) for ``x`` (``[T, ...]`` in multi-step mode, ``[...]`` in single-step mode)."""
        observer = _OBSERVER.get()
        if self.step_mode == "m":
            spikes, v = self.multi_step(x, return_v_seq=self.store_v_seq or observer is not None)
            if self.store_v_seq:
                self.sow(nnx.Intermediate, "v_seq", v, reduce_fn=lambda _, new: new, init_fn=lambda: None)
        else:
            names = self.initial_state()
            state = {name: getattr(self, name).get_value() for name in names}
            spikes, new = self.step(x, state if len(names) > 1 else state["v"])
            new = new if len(names) > 1 else {"v": new}
            for name in names:
                getattr(self, name).set_value(new[name])
            v = new["v"]
        if observer is not None:
            observer(self, spikes, v)
        return spikes

    def multi_step(self, x_seq: jax.Array, v_init=None, *, return_v_seq: bool = False):
        """Run ``x_seq [T, ...]`` from ``v_init`` (default: fresh state; a dict of state variables for a neuron
        with several).

        Returns ``(spikes [T, ...], v)``, ``v`` being the membrane potential ``[T, ...]`` if ``return_v_seq``,
        else the final state (``[...]``, or the dict of state variables).
        """
        neuron, w = (self.config, self.decay_param()) if self.kind is not None else self._step_neuron()
        return dispatch.multistep(neuron, x_seq, v_init, w, return_v_seq=return_v_seq, impl=self.impl)

    def step(self, x: jax.Array, v) -> tuple[jax.Array, jax.Array]:
        """One explicit-state step: ``(spikes, new state)`` (``v`` the membrane potential, or the dict of state
        variables for a neuron with several)."""
        if self.kind is not None:
            return B.step(self.config, x, v, self.decay_param())
        sdt = B.state_dtype(x.dtype)
        state = {k: jnp.asarray(a).astype(sdt) for k, a in (v.items() if isinstance(v, dict) else [("v", v)])}
        out, new = self.single_step(x.astype(sdt), state, self.params())
        return out.astype(x.dtype), (new if isinstance(v, dict) else new["v"])

    def reset(self) -> None:
        """Forget the streaming state (SpikingJelly's ``reset()``)."""
        for name, value in self._fresh_state().items():
            getattr(self, name).set_value(value)


class IFNode(BaseNode):
    """Integrate-and-fire: ``H = V + X``."""

    kind = "IF"

    def neuronal_charge(self, x, v, params):
        return B.charge(self.config, v, x, None)


class LIFNode(BaseNode):
    """Leaky integrate-and-fire with time constant ``tau`` (> 1)."""

    kind = "LIF"

    def __init__(self, tau: float = 2.0, decay_input: bool = True, v_threshold: float = 1.0,
                 v_reset: float | None = 0.0, surrogate_function: sg.Surrogate = sg.Sigmoid(),
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False, impl: str = "auto"):
        self.tau = float(tau)
        self.decay_input = decay_input
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq, impl)
        B.NeuronConfig(kind="LIF", tau=self.tau)  # validates tau

    def _config_kwargs(self):
        return {"tau": self.tau, "decay_input": self.decay_input}

    def neuronal_charge(self, x, v, params):
        return B.charge(self.config, v, x, None)


class ParametricLIFNode(BaseNode):
    """LIF with a learned time constant: ``1/tau = sigmoid(w)``, ``w`` initialised to ``-log(init_tau - 1)``."""

    kind = "PLIF"

    def __init__(self, init_tau: float = 2.0, decay_input: bool = True, v_threshold: float = 1.0,
                 v_reset: float | None = 0.0, surrogate_function: sg.Surrogate = sg.Sigmoid(),
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False, impl: str = "auto"):
        if not init_tau > 1.0:
            raise ValueError(f"ParametricLIFNode needs init_tau > 1, got {init_tau}")
        self.decay_input = decay_input
        self.w = nnx.Param(jnp.asarray(-math.log(init_tau - 1.0), dtype=float))
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq, impl)

    def _config_kwargs(self):
        return {"decay_input": self.decay_input}

    def decay_param(self):
        return self.w[...]

    def neuronal_charge(self, x, v, params):
        return B.charge(self.config, v, x, params["w"])


def set_impl(model: nnx.Module, impl: str) -> int:
    """Make every neuron of ``model`` run its multi-step mode with ``impl`` (``"auto"``, ``"xla"``, ``"pallas"``,
    ``"native"``, ``"scan"``, ``"assoc"``; ``snnjax.neurons.kernels.dispatch``). A neuron given by its step (``kind``
    None) takes ``scan`` for ``xla`` (the hand-written XLA path is IF / LIF / PLIF's; ``scan`` is the step's own
    pure-XLA path); ``assoc`` is set only on the neurons that declare a linear recurrence (``declares_linear``), the
    others keep theirs. Returns the number of neurons set."""
    if impl not in dispatch.IMPLS:
        raise ValueError(f"impl must be one of {dispatch.IMPLS}, got {impl!r}")
    count = 0
    for _, module in nnx.iter_modules(model):
        if isinstance(module, BaseNode):
            if impl == "assoc" and (module.kind is not None or not module.declares_linear()):
                continue
            module.impl = impl if module.kind is not None or impl == "auto" or dispatch.IMPLEMENTATIONS[
                impl].any_neuron else "scan"
            count += 1
    return count


def reset_net(model: nnx.Module) -> None:
    """Reset the streaming state of every neuron in ``model`` (SpikingJelly's ``functional.reset_net``): every
    ``Stateful`` module's ``reset()``."""
    for _, module in nnx.iter_modules(model):
        if isinstance(module, Stateful):
            module.reset()
