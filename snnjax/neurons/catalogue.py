"""SpikingJelly 2.0.0's other neurons, each written as its single step (``BaseNode``'s hooks), with SpikingJelly's
class names, keywords and defaults; their multi-step mode is the ``scan`` implementation. They fire through the
surrogate's call (``S = surrogate(H - v_threshold)``), so every surrogate works as in SpikingJelly: a spiking one
fires the step ``1[H >= v_threshold]``, ``spiking=False`` its smooth primitive, ``MultiLevelSpikeCount`` counts.

=====================  =================================================================================
class                  one step (``vr = v_reset`` or 0; fire ``S = 1[H >= v_threshold]``, then reset)
=====================  =================================================================================
``CUBALIFNode``        ``C = C c_decay + X``, ``H = V v_decay + C`` (state ``v`` and current ``c``)
``NonSpikingIFNode``   ``V = V + X``; outputs ``V`` (no fire, no reset), ``decode`` over T
``NonSpikingLIFNode``  ``V = V + (X - V) / tau``; as above
``QIFNode``            ``H = V + (X + a0 (V - v_rest)(V - v_c)) / tau``
``EIFNode``            ``H = V + (X + v_rest - V + delta_T exp((V - theta_rh) / delta_T)) / tau``
``KLIFNode``           ``H = relu(k LIF-charge)``, ``k`` learned (init 1); ``scale_reset`` resets ``H / k``
``IzhikevichNode``     ``H = V + (X + a0 (V - v_rest)(V - v_c) - W) / tau``; after firing
                       ``W = W + (a (H - v_rest) - W) / tau_w + b S`` (state ``v`` and recovery ``w``)
``TernaryIFNode``      ``H = V + X``; ``S = 1[H >= v_threshold] - 1[-H >= v_threshold]`` in {-1, 0, 1}
``TernaryLIFNode``     LIF's charge; the ternary spike of ``TernaryIFNode``
``LIAFNode``           LIF (fire and reset as LIF's) whose output is ``act(H - v_threshold)``
                       (``threshold_related``) or ``act(H)``: analog, not spikes
``GatedLIFNode``       learned gates (below); the previous spike resets inside the charge
``HalfThresholdIFNode`` IF with soft reset, starting from ``v_threshold / 2``
``RAFNode``            resonate-and-fire: ``(U, V)`` rotated by ``omega dt`` and damped by ``exp(b dt)``, ``U``
                       taking ``X``; fire and reset on ``V`` (state ``v`` and ``u``)
``ComplementaryLIFNode`` ``H = V - V / tau + X``; ``M = M sigmoid(H / tau) + S``; soft reset by
                       ``S (v_threshold + sigmoid(M))`` (state ``v`` and ``m``)
``ILIFNode``           integer LIF: ``H = V - V / tau + X``; counts ``S = round(clip(H / v_threshold, 0, D))`` (a
                       ``MultiLevelSpikeCount(D)`` surrogate at ``H / v_threshold``); soft reset ``H - S v_threshold``
=====================  =================================================================================

The ternary neurons reset on either spike: soft by ``S v_threshold``; hard to ``v_reset`` with the event
``1[H >= th] + 1[-H >= th]`` (which keeps both branches' surrogate gradients).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax.neurons import base as B
from snnjax.neurons import surrogate as sg
from snnjax.neurons.modules import BaseNode

__all__ = ["CUBALIFNode", "ComplementaryLIFNode", "EIFNode", "GatedLIFNode", "HalfThresholdIFNode", "ILIFNode",
           "IzhikevichNode", "KLIFNode", "LIAFNode", "NonSpikingIFNode", "NonSpikingLIFNode", "QIFNode", "RAFNode",
           "TernaryIFNode", "TernaryLIFNode"]


def _lif_charge(x, v, tau: float, decay_input: bool, v_reset: float | None):
    """LIF's H in SpikingJelly's general form (``vr = v_reset`` or 0)."""
    vr = 0.0 if v_reset is None else v_reset
    return v + (x - (v - vr)) / tau if decay_input else v - (v - vr) / tau + x


def _check_tau(cls: str, tau: float, name: str = "tau") -> None:
    if not tau > 1.0:
        raise ValueError(f"{cls} needs {name} > 1 (SpikingJelly's requirement), got {name}={tau}")


class CUBALIFNode(BaseNode):
    """Current-based LIF: a synaptic current ``c`` decays by ``c_decay`` and feeds ``v``, which decays by
    ``v_decay`` (factors kept per step, not time constants). SpikingJelly's defaults: threshold 0.5, ``Rect()``."""

    def __init__(self, c_decay: float = 0.5, v_decay: float = 0.75, v_threshold: float = 0.5,
                 v_reset: float | None = 0.0, surrogate_function: sg.Surrogate = sg.Rect(),
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False, impl: str = "auto"):
        self.c_decay = float(c_decay)
        self.v_decay = float(v_decay)
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq, impl)

    def initial_state(self):
        return {"v": 0.0 if self.v_reset is None else self.v_reset, "c": 0.0}

    def neuronal_charge(self, x, v, params):
        c = v["c"] * self.c_decay + x
        return {"v": v["v"] * self.v_decay + c, "c": c}


DECODES = (None, "max-mem", "max-abs-mem", "mean-mem", "last_mem")


class _NonSpiking(BaseNode):
    """A leaky-integrator readout: outputs the membrane potential (no threshold, no reset), multi-step, from 0;
    ``decode`` reduces the ``[T, ...]`` potentials over time (``max-mem``, ``max-abs-mem``: the larger in
    magnitude of max and min, ``mean-mem``, ``last_mem``; None: the sequence)."""

    def __init__(self, decode: str | None = None, step_mode: str = "m", store_v_seq: bool = False,
                 impl: str = "auto"):
        if decode not in DECODES:
            raise ValueError(f"decode must be one of {DECODES}, got {decode!r}")
        if decode is not None and step_mode != "m":
            raise ValueError(f"decode={decode!r} reduces over time: it needs step_mode='m', got {step_mode!r}")
        self.decode = decode
        super().__init__(v_reset=0.0, step_mode=step_mode, store_v_seq=store_v_seq, impl=impl)

    def neuronal_fire(self, h, params):
        return h["v"]

    def neuronal_reset(self, h, spike, params):
        return h

    def __call__(self, x: jax.Array) -> jax.Array:
        v_seq = super().__call__(x)
        if self.decode is None or self.step_mode != "m":
            return v_seq
        if self.decode == "max-mem":
            return v_seq.max(0)
        if self.decode == "max-abs-mem":
            hi, lo = v_seq.max(0), v_seq.min(0)
            return jnp.where(jnp.abs(hi) > jnp.abs(lo), hi, lo)
        if self.decode == "mean-mem":
            return v_seq.mean(0)
        return v_seq[-1]


class NonSpikingIFNode(_NonSpiking):
    """Non-spiking IF readout: ``V = V + X``, outputs ``V``."""

    def neuronal_charge(self, x, v, params):
        return v + x

    def linear_recurrence(self, params):
        return 1.0, 1.0


class NonSpikingLIFNode(_NonSpiking):
    """Non-spiking LIF readout: ``V = V + (X - V) / tau``, outputs ``V``."""

    def __init__(self, tau: float = 2.0, decode: str | None = None, step_mode: str = "m",
                 store_v_seq: bool = False, impl: str = "auto"):
        self.tau = float(tau)
        super().__init__(decode, step_mode, store_v_seq, impl)

    def neuronal_charge(self, x, v, params):
        return v + (x - v) / self.tau

    def linear_recurrence(self, params):
        return 1.0 - 1.0 / self.tau, 1.0 / self.tau


def _check_reset_order(cls: str, v_threshold: float, v_reset: float | None, v_rest: float) -> None:
    if v_reset is not None and not (v_threshold > v_reset and v_rest >= v_reset):
        raise ValueError(f"{cls} needs v_threshold > v_reset and v_rest >= v_reset (SpikingJelly's requirement), "
                         f"got v_threshold={v_threshold}, v_reset={v_reset}, v_rest={v_rest}")


class QIFNode(BaseNode):
    """Quadratic integrate-and-fire: ``H = V + (X + a0 (V - v_rest)(V - v_c)) / tau``."""

    def __init__(self, tau: float = 2.0, v_c: float = 0.8, a0: float = 1.0, v_threshold: float = 1.0,
                 v_rest: float = 0.0, v_reset: float | None = -0.1, surrogate_function: sg.Surrogate = sg.Sigmoid(),
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False, impl: str = "auto"):
        _check_tau("QIFNode", tau)
        _check_reset_order("QIFNode", v_threshold, v_reset, v_rest)
        if not a0 > 0:
            raise ValueError(f"QIFNode needs a0 > 0, got a0={a0}")
        self.tau, self.v_c, self.a0, self.v_rest = float(tau), float(v_c), float(a0), float(v_rest)
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq, impl)

    def neuronal_charge(self, x, v, params):
        return v + (x + self.a0 * (v - self.v_rest) * (v - self.v_c)) / self.tau


class EIFNode(BaseNode):
    """Exponential integrate-and-fire: ``H = V + (X + v_rest - V + delta_T exp((V - theta_rh) / delta_T)) / tau``."""

    def __init__(self, tau: float = 2.0, delta_T: float = 1.0, theta_rh: float = 0.8, v_threshold: float = 1.0,
                 v_rest: float = 0.0, v_reset: float | None = -0.1, surrogate_function: sg.Surrogate = sg.Sigmoid(),
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False, impl: str = "auto"):
        _check_tau("EIFNode", tau)
        _check_reset_order("EIFNode", v_threshold, v_reset, v_rest)
        if not delta_T > 0:
            raise ValueError(f"EIFNode needs delta_T > 0, got delta_T={delta_T}")
        self.tau, self.delta_T, self.theta_rh, self.v_rest = float(tau), float(delta_T), float(theta_rh), float(v_rest)
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq, impl)

    def neuronal_charge(self, x, v, params):
        return v + (x + self.v_rest - v + self.delta_T * jnp.exp((v - self.theta_rh) / self.delta_T)) / self.tau


class KLIFNode(BaseNode):
    """LIF with a learned scale ``k`` (a scalar ``nnx.Param``, 1 at first): ``H = relu(k LIF-charge)``; with
    ``scale_reset`` the reset acts on ``H / k`` with threshold ``v_threshold / k``."""

    def __init__(self, scale_reset: bool = False, tau: float = 2.0, decay_input: bool = True,
                 v_threshold: float = 1.0, v_reset: float | None = 0.0, surrogate_function: sg.Surrogate = sg.Sigmoid(),
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False, impl: str = "auto"):
        _check_tau("KLIFNode", tau)
        self.scale_reset, self.tau, self.decay_input = scale_reset, float(tau), decay_input
        self.k = nnx.Param(jnp.asarray(1.0, dtype=float))
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq, impl)

    def neuronal_charge(self, x, v, params):
        k = params["k"].astype(v.dtype)
        return jax.nn.relu(k * _lif_charge(x, v, self.tau, self.decay_input, self.v_reset))

    def neuronal_reset(self, h, spike, params):
        if not self.scale_reset:
            return super().neuronal_reset(h, spike, params)
        k = params["k"].astype(h["v"].dtype)
        s = jax.lax.stop_gradient(spike) if self.detach_reset else spike
        return {"v": B.reset_potential(h["v"] / k, s, self.v_threshold / k, self.v_reset)}


class IzhikevichNode(BaseNode):
    """Izhikevich (SpikingJelly's adaptive QIF): state ``v`` and recovery ``w`` (fresh ``w_rest``);
    ``H = V + (X + a0 (V - v_rest)(V - v_c) - W) / tau``, then ``W = W + (a (H - v_rest) - W) / tau_w + b S``."""

    def __init__(self, tau: float = 2.0, v_c: float = 0.8, a0: float = 1.0, v_threshold: float = 1.0,
                 v_reset: float | None = 0.0, v_rest: float = -0.1, w_rest: float = 0.0, tau_w: float = 2.0,
                 a: float = 0.0, b: float = 0.0, surrogate_function: sg.Surrogate = sg.Sigmoid(),
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False, impl: str = "auto"):
        _check_tau("IzhikevichNode", tau)
        if not a0 > 0:
            raise ValueError(f"IzhikevichNode needs a0 > 0, got a0={a0}")
        self.tau, self.v_c, self.a0, self.v_rest = float(tau), float(v_c), float(a0), float(v_rest)
        self.w_rest, self.tau_w, self.a, self.b = float(w_rest), float(tau_w), float(a), float(b)
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq, impl)

    def initial_state(self):
        return {"v": 0.0 if self.v_reset is None else self.v_reset, "w": self.w_rest}

    def neuronal_charge(self, x, v, params):
        h = v["v"] + (x + self.a0 * (v["v"] - self.v_rest) * (v["v"] - self.v_c) - v["w"]) / self.tau
        return {"v": h, "w": v["w"]}

    def neuronal_reset(self, h, spike, params):
        w = h["w"] + (self.a * (h["v"] - self.v_rest) - h["w"]) / self.tau_w + self.b * spike
        return {**super().neuronal_reset(h, spike, params), "w": w}


def _check_ternary(cls: str, v_threshold: float, v_reset: float | None) -> None:
    if not (math.isfinite(v_threshold) and v_threshold > 0):
        raise ValueError(f"{cls} needs a finite v_threshold > 0, got {v_threshold}")
    if v_reset is not None and not -v_threshold < v_reset < v_threshold:
        raise ValueError(f"{cls} needs -v_threshold < v_reset < v_threshold, got v_reset={v_reset}")


class _Ternary(BaseNode):
    """Spikes in {-1, 0, 1}: ``1[H >= v_threshold] - 1[-H >= v_threshold]``."""

    def neuronal_fire(self, h, params):
        return (self.surrogate_function(h["v"] - self.v_threshold)
                - self.surrogate_function(-h["v"] - self.v_threshold))

    def neuronal_reset(self, h, spike, params):
        # Soft: V - S th. Hard: the reset event is either spike, each with its own surrogate gradient.
        event = spike if self.v_reset is None else (
            self.surrogate_function(h["v"] - self.v_threshold)
            + self.surrogate_function(-h["v"] - self.v_threshold))
        event = jax.lax.stop_gradient(event) if self.detach_reset else event
        return {"v": B.reset_potential(h["v"], event, self.v_threshold, self.v_reset)}


class TernaryIFNode(_Ternary):
    """IF with ternary spikes: ``H = V + X``."""

    def __init__(self, v_threshold: float = 1.0, v_reset: float | None = 0.0,
                 surrogate_function: sg.Surrogate = sg.Sigmoid(), detach_reset: bool = False, step_mode: str = "s",
                 store_v_seq: bool = False, impl: str = "auto"):
        _check_ternary("TernaryIFNode", v_threshold, v_reset)
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq, impl)

    def neuronal_charge(self, x, v, params):
        return v + x

    def linear_recurrence(self, params):
        return 1.0, 1.0


class TernaryLIFNode(_Ternary):
    """LIF with ternary spikes."""

    def __init__(self, tau: float = 2.0, decay_input: bool = True, v_threshold: float = 1.0,
                 v_reset: float | None = 0.0, surrogate_function: sg.Surrogate = sg.Sigmoid(),
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False, impl: str = "auto"):
        _check_ternary("TernaryLIFNode", v_threshold, v_reset)
        _check_tau("TernaryLIFNode", tau)
        self.tau, self.decay_input = float(tau), decay_input
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq, impl)

    def neuronal_charge(self, x, v, params):
        return _lif_charge(x, v, self.tau, self.decay_input, self.v_reset)


class LIAFNode(BaseNode):
    """Leaky integrate and analog fire: LIF's charge, spike and reset, but the output is ``act(H - v_threshold)``
    with ``threshold_related``, else ``act(H)`` (``act`` any JAX function, e.g. ``jax.nn.relu``)."""

    def __init__(self, act: Callable[[jax.Array], jax.Array], threshold_related: bool, tau: float = 2.0,
                 decay_input: bool = True, v_threshold: float = 1.0, v_reset: float | None = 0.0,
                 surrogate_function: sg.Surrogate = sg.Sigmoid(), detach_reset: bool = False, step_mode: str = "s",
                 store_v_seq: bool = False, impl: str = "auto"):
        if not callable(act):
            raise TypeError(f"LIAFNode's act must be a function of an array (e.g. jax.nn.relu), got {act!r}")
        _check_tau("LIAFNode", tau)
        self.act, self.threshold_related = act, threshold_related
        self.tau, self.decay_input = float(tau), decay_input
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq, impl)

    def neuronal_charge(self, x, v, params):
        return _lif_charge(x, v, self.tau, self.decay_input, self.v_reset)

    def single_step(self, x, state, params):
        h = {"v": self.neuronal_charge(x, state["v"], params)}
        y = self.act(h["v"] - self.v_threshold if self.threshold_related else h["v"])
        return y, self.neuronal_reset(h, self.neuronal_fire(h, params), params)


def _logit(p: float) -> float:
    return -math.log(1.0 / p - 1.0)


class GatedLIFNode(BaseNode):
    """Gated LIF, multi-step over exactly ``T`` steps, every parameter learned through a sigmoid, one per channel
    (the last axis; ``inplane`` channels, None: one scalar each). With ``a, b, g, k, th, d, r`` the sigmoids of
    ``alpha, beta, gamma, tau, v_threshold, linear_decay, v_subreset``, ``c_t`` that of ``conduct[t]`` (one per
    time step), ``S`` the previous step's spike and ``m = 1 - a (1 - k)``::

        H = m V - (1 - a) d + X (1 - b (1 - c_t)) - m V g S - (1 - g) r S;   S = 1[H >= th];   V = H

    ``alpha, beta, gamma`` start uniform in [-0.1, 0.1) (from ``rngs``, default ``nnx.Rngs(0)``); the others at
    the logits of their ``init_*`` values (``init_linear_decay``: ``init_v_threshold / (2 T)``,
    ``init_v_subreset``: ``init_v_threshold``). State: ``v``, the previous spike ``s`` and the step ``t``.
    """

    def __init__(self, T: int, inplane: int | None = None, init_linear_decay: float | None = None,
                 init_v_subreset: float | None = None, init_tau: float = 0.25, init_v_threshold: float = 0.5,
                 init_conduct: float = 0.5, surrogate_function: sg.Surrogate = sg.Sigmoid(), step_mode: str = "m",
                 impl: str = "auto", rngs: nnx.Rngs | None = None):
        if not (isinstance(T, int) and T > 0):
            raise ValueError(f"GatedLIFNode needs the number of time steps T > 0 (an int), got T={T!r}")
        if step_mode != "m":
            raise ValueError(f"GatedLIFNode is multi-step only (its conductance is per time step): step_mode='m', "
                             f"got {step_mode!r}")
        init_linear_decay = init_v_threshold / (T * 2) if init_linear_decay is None else init_linear_decay
        init_v_subreset = init_v_threshold if init_v_subreset is None else init_v_subreset
        for name, value in (("init_tau", init_tau), ("init_v_threshold", init_v_threshold),
                            ("init_conduct", init_conduct), ("init_linear_decay", init_linear_decay),
                            ("init_v_subreset", init_v_subreset)):
            if not 0.0 < value < 1.0:
                raise ValueError(f"GatedLIFNode needs 0 < {name} < 1 (a sigmoid's value), got {value}")
        self.T = T
        super().__init__(v_threshold=init_v_threshold, v_reset=None, surrogate_function=surrogate_function,
                         step_mode="m", impl=impl)
        shape = () if inplane is None else (inplane,)
        key = (rngs or nnx.Rngs(0)).params()
        for name, k in zip(("alpha", "beta", "gamma"), jax.random.split(key, 3), strict=True):
            setattr(self, name, nnx.Param(0.2 * (jax.random.uniform(k, shape, dtype=float) - 0.5)))
        full = lambda p, s=shape: nnx.Param(jnp.full(s, _logit(p), dtype=float))  # noqa: E731
        # SpikingJelly's names: v_threshold is a learned parameter here (the threshold is its sigmoid).
        del self.v_threshold  # BaseNode's number, replaced by the parameter
        self.tau, self.v_threshold = full(init_tau), full(init_v_threshold)
        self.linear_decay, self.v_subreset = full(init_linear_decay), full(init_v_subreset)
        self.conduct = full(init_conduct, (T, *shape))

    def initial_state(self):
        return {"v": 0.0, "s": 0.0, "t": 0.0}

    def neuronal_charge(self, x, v, params):
        sig = {k: jax.nn.sigmoid(a).astype(x.dtype) for k, a in params.items() if k != "conduct"}
        t = v["t"].reshape(-1)[0].astype(jnp.int32)
        c = jax.nn.sigmoid(jax.lax.dynamic_index_in_dim(params["conduct"], t, keepdims=False)).astype(x.dtype)
        a, g, keep = sig["alpha"], sig["gamma"], 1 - sig["alpha"] * (1 - sig["tau"])
        h = (keep * v["v"] - (1 - a) * sig["linear_decay"]) + x * (1 - sig["beta"] * (1 - c))
        h = h - keep * v["v"] * g * v["s"] - (1 - g) * sig["v_subreset"] * v["s"]
        return {"v": h, "s": v["s"], "t": v["t"] + 1.0}

    def neuronal_fire(self, h, params):
        return self.surrogate_function(h["v"] - jax.nn.sigmoid(params["v_threshold"]).astype(h["v"].dtype))

    def neuronal_reset(self, h, spike, params):
        return {**h, "s": spike}

    def multi_step(self, x_seq, v_init=None, *, return_v_seq=False):
        if x_seq.shape[0] != self.T:
            raise ValueError(f"GatedLIFNode(T={self.T}) got {x_seq.shape[0]} time steps; build it with T equal to "
                             "the input's")
        return super().multi_step(x_seq, v_init, return_v_seq=return_v_seq)


class HalfThresholdIFNode(BaseNode):
    """IF with soft reset whose potential starts (and restarts on ``reset()``) at ``v_threshold / 2``."""

    def __init__(self, v_threshold: float = 1.0, surrogate_function: sg.Surrogate = sg.Sigmoid(),
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False, impl: str = "auto"):
        if not (math.isfinite(v_threshold) and v_threshold > 0):
            raise ValueError(f"HalfThresholdIFNode needs a finite v_threshold > 0, got {v_threshold}")
        super().__init__(float(v_threshold), None, surrogate_function, detach_reset, step_mode, store_v_seq, impl)

    def initial_state(self):
        return {"v": self.v_threshold / 2.0}

    def neuronal_charge(self, x, v, params):
        return v + x

    def linear_recurrence(self, params):
        return 1.0, 1.0


class RAFNode(BaseNode):
    """Resonate-and-fire: with ``r = exp(b dt)``, ``c, s = cos(omega dt), sin(omega dt)``:
    ``U = r (U c - V s) + X``, ``H = r (U s + V c)`` (both from the old ``U, V``), then fire and reset ``H``."""

    def __init__(self, b: float = -0.2, omega: float = 1.0, dt: float = 1.0, v_threshold: float = 1.0,
                 v_reset: float | None = 0.0, surrogate_function: sg.Surrogate = sg.Sigmoid(),
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False, impl: str = "auto"):
        for name, value, ok in (("b", b, b < 0), ("omega", omega, omega > 0), ("dt", dt, dt > 0)):
            if not ok:
                raise ValueError(f"RAFNode needs {name} {'< 0' if name == 'b' else '> 0'}, got {name}={value}")
        self.b, self.omega, self.dt = float(b), float(omega), float(dt)
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq, impl)

    def initial_state(self):
        return {"v": 0.0 if self.v_reset is None else self.v_reset, "u": 0.0}

    def neuronal_charge(self, x, v, params):
        r, c, s = math.exp(self.b * self.dt), math.cos(self.omega * self.dt), math.sin(self.omega * self.dt)
        return {"v": r * (v["u"] * s + v["v"] * c), "u": r * (v["u"] * c - v["v"] * s) + x}


class ComplementaryLIFNode(BaseNode):
    """Complementary LIF: a LIF without decay of the input and a complementary potential ``m`` that decays by
    ``sigmoid(H / tau)`` and gains each spike; the soft reset subtracts ``S (v_threshold + sigmoid(M))``.
    ``store_state_seqs`` is SpikingJelly's name for ``store_v_seq`` here (``v_seq`` is sown)."""

    def __init__(self, tau: float = 2.0, v_threshold: float = 1.0, surrogate_function: sg.Surrogate = sg.Rect(),
                 step_mode: str = "s", store_state_seqs: bool = False, impl: str = "auto"):
        _check_tau("ComplementaryLIFNode", tau)
        self.tau = float(tau)
        super().__init__(v_threshold, None, surrogate_function, False, step_mode, store_state_seqs, impl)

    def initial_state(self):
        return {"v": 0.0, "m": 0.0}

    def neuronal_charge(self, x, v, params):
        return {"v": v["v"] - (v["v"] - 0.0) / self.tau + x, "m": v["m"]}

    def neuronal_reset(self, h, spike, params):
        m = h["m"] * jax.nn.sigmoid(h["v"] / self.tau) + spike
        return {"v": h["v"] - spike * (self.v_threshold + jax.nn.sigmoid(m)), "m": m}


class ILIFNode(BaseNode):
    """Integer LIF (I-LIF): LIF's charge without input decay, ``H = V - V / tau + X``; fires the spike count
    ``S = surrogate(H / v_threshold)``, ``round(clip(H / v_threshold, 0, max_spike_count))`` with its gradient
    window, and resets softly, ``V = H - S v_threshold``. The surrogate must be a spiking ``MultiLevelSpikeCount``
    (default ``MultiLevelSpikeCount(4)``); ``tau = 4/3`` is a decay of 0.25 per step."""

    def __init__(self, tau: float = 4.0 / 3.0, v_threshold: float = 1.0,
                 surrogate_function: sg.Surrogate = sg.MultiLevelSpikeCount(4), detach_reset: bool = False,
                 step_mode: str = "s", store_v_seq: bool = False, impl: str = "auto"):
        if not (isinstance(surrogate_function, sg.MultiLevelSpikeCount) and surrogate_function.spiking):
            raise ValueError(f"ILIFNode fires spike counts: surrogate_function must be a spiking "
                             f"MultiLevelSpikeCount(max_spike_count), got {surrogate_function!r}")
        _check_tau("ILIFNode", tau)
        if not (math.isfinite(v_threshold) and v_threshold > 0):
            raise ValueError(f"ILIFNode needs a finite v_threshold > 0, got {v_threshold}")
        self.tau = float(tau)
        super().__init__(float(v_threshold), None, surrogate_function, detach_reset, step_mode, store_v_seq, impl)

    def neuronal_charge(self, x, v, params):
        return _lif_charge(x, v, self.tau, False, None)

    def neuronal_fire(self, h, params):
        return self.surrogate_function(h["v"] / self.v_threshold)
