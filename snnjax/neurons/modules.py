"""Flax NNX spiking neuron modules with SpikingJelly's keyword names and defaults.

``step_mode='m'`` (multi-step) maps ``[T, ...] -> [T, ...]`` spikes and is pure:
every call starts from a fresh state (``v_reset``), so training needs no
``reset_net``; pass ``v_init`` to ``multi_step`` to continue from a given state.
``step_mode='s'`` (single-step) is the stateful streaming variant: the membrane
potential lives in a ``MembranePotential`` variable across calls until
``reset()`` (or ``reset_net(model)``). ``step(x, v)`` is the explicit-state
single step. With ``store_v_seq=True`` the multi-step state sequence is sown as an
``nnx.Intermediate`` named ``v_seq``; read it with ``nnx.capture(model, nnx.Intermediate)(x)``.
``impl`` (``"auto"``, ``"xla"``, ``"pallas"``, ``"native"``) picks the multi-step implementation
(``snnjax.neurons.kernels.dispatch``); it can be changed on a built model (``node.impl = "pallas"``).
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
    """Shared machinery of IF / LIF / PLIF; subclasses set ``kind`` and the decay."""

    kind: B.Kind = "IF"

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
        self.v_threshold = v_threshold
        self.v_reset = v_reset
        self.surrogate_function = surrogate_function
        self.detach_reset = detach_reset
        self.step_mode = step_mode
        self.store_v_seq = store_v_seq
        self.impl = impl
        self.v = MembranePotential(self._fresh_state())

    def _fresh_state(self) -> jax.Array:
        # The default float dtype: float64 under jax_enable_x64, so v_reset is not rounded to float32.
        return jnp.asarray(0.0 if self.v_reset is None else self.v_reset, dtype=float)

    # Subclasses override these two.
    def _config_kwargs(self) -> dict:
        return {}

    def decay_param(self) -> jax.Array | None:
        return None

    @property
    def config(self) -> B.NeuronConfig:
        """The static hyperparameters as a ``NeuronConfig``."""
        return B.NeuronConfig(
            kind=self.kind,
            v_threshold=self.v_threshold,
            v_reset=self.v_reset,
            detach_reset=self.detach_reset,
            surrogate=self.surrogate_function,
            **self._config_kwargs(),
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        """Spikes for ``x`` (``[T, ...]`` in multi-step mode, ``[...]`` in single-step mode)."""
        observer = _OBSERVER.get()
        if self.step_mode == "m":
            spikes, v = self.multi_step(x, return_v_seq=self.store_v_seq or observer is not None)
            if self.store_v_seq:
                self.sow(nnx.Intermediate, "v_seq", v, reduce_fn=lambda _, new: new, init_fn=lambda: None)
        else:
            spikes, v = self.step(x, self.v.get_value())
            self.v.set_value(v)
        if observer is not None:
            observer(self, spikes, v)
        return spikes

    def multi_step(self, x_seq: jax.Array, v_init: jax.Array | None = None, *, return_v_seq: bool = False):
        """Run ``x_seq [T, ...]`` from ``v_init`` (default: fresh state).

        Returns ``(spikes [T, ...], v)``, ``v`` being ``[T, ...]`` if ``return_v_seq`` else the final state.
        """
        return dispatch.multistep(self.config, x_seq, v_init, self.decay_param(), return_v_seq=return_v_seq,
                                  impl=self.impl)

    def step(self, x: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
        """One explicit-state step: ``(spikes, new state)``."""
        return B.step(self.config, x, v, self.decay_param())

    def reset(self) -> None:
        """Forget the streaming state (SpikingJelly's ``reset()``)."""
        self.v.set_value(self._fresh_state())


class IFNode(BaseNode):
    """Integrate-and-fire: ``H = V + X``."""

    kind = "IF"


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


def set_impl(model: nnx.Module, impl: str) -> int:
    """Make every neuron of ``model`` run its multi-step mode with ``impl`` (``"auto"``, ``"xla"``, ``"pallas"``,
    ``"native"``; ``snnjax.neurons.kernels.dispatch``). Returns the number of neurons changed."""
    if impl not in dispatch.IMPLS:
        raise ValueError(f"impl must be one of {dispatch.IMPLS}, got {impl!r}")
    count = 0
    for _, module in nnx.iter_modules(model):
        if isinstance(module, BaseNode):
            module.impl = impl
            count += 1
    return count


def reset_net(model: nnx.Module) -> None:
    """Reset the streaming state of every neuron in ``model`` (SpikingJelly's ``functional.reset_net``): every
    ``Stateful`` module's ``reset()``."""
    for _, module in nnx.iter_modules(model):
        if isinstance(module, Stateful):
            module.reset()
