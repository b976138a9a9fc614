"""Spike-timing-dependent plasticity beside gradient descent: SpikingJelly 2.0.0's ``learning.STDPLearner`` and
its reward-modulated ``MSTDPLearner`` / ``MSTDPETLearner``, in snnjax's layouts.

The rules are pure functions (``stdp_linear_step``, ``stdp_conv2d_step``, ``stdp_multistep``, ``mstdp_linear_step``,
``mstdpet_linear_step``, ``mstdpet_reward_step``): spikes and traces in, ``(delta_w, new traces)`` out, ``delta_w``
shaped like the layer's kernel (``[in, out]`` for a linear layer, ``[kh, kw, in, out]`` for a convolution). The
traces decay by Euler steps, ``tr <- tr - tr / tau + s`` (``exp(-1 / tau)`` for the reward-modulated rules), and are
updated before the weight change reads them; updates are summed over the batch and the convolution's positions.

A learner watches one synapse (an ``snnjax.layers.linear`` / ``conv2d``) and the module that fires its output
spikes (``sn``, a neuron), keeps the traces, and turns a forward pass's spikes into the weight change::

    learner = learning.STDPLearner("m", net.layers[0], net.layers[1], tau_pre=2.0, tau_post=100.0)

    @nnx.jit
    def train_step(net, optimizer, learner, x, y):             # the learner goes in: its traces change
        def loss_fn(net):
            with learning.record([learner]) as records:        # the synapse's inputs, the neuron's spikes
                out = net(x)
            return loss(out, y), records                       # records leave the gradient as aux data
        (loss, records), grads = nnx.value_and_grad(loss_fn, has_aux=True)(net)
        delta = learner.step(records[0])                       # SpikingJelly's step(on_grad=False)
        grads = learning.on_grad(grads, net, learner, delta)   # ... on_grad=True: -delta joins the gradient
        optimizer.update(net, grads)                           # any optax transformation

``learner.reset()`` forgets the traces; ``close()`` detaches the learner.
A synapse's weight is its ``kernel``; its bias is never changed. Convolutions need ``feature_group_count=1`` and no
dilation, as SpikingJelly's; ``f_pre`` / ``f_post`` are applied to the whole kernel, elementwise.
"""
from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax.layers.conv import Conv2d, Linear, observe_inputs
from snnjax.neurons.modules import BaseNode, Stateful, observe

__all__ = ["MSTDPETLearner", "MSTDPLearner", "STDPLearner", "mstdp_linear_step", "mstdpet_linear_step",
           "mstdpet_reward_step", "on_grad", "record", "stdp_conv2d_step", "stdp_linear_step", "stdp_multistep"]

Trace = tuple[jax.Array, jax.Array]
Modulation = Callable[[jax.Array], jax.Array]


def _identity(x: jax.Array) -> jax.Array:
    return x


def _check_taus(exponential: bool, **taus: float) -> None:
    for name, tau in taus.items():
        if not math.isfinite(tau) or tau <= 0 or (not exponential and tau < 1):
            raise ValueError(f"{name} must be finite and {'> 0' if exponential else '>= 1'} time steps, got {tau}")


def _traces(in_spike: jax.Array, out_spike: jax.Array, trace: Trace | None) -> Trace:
    """``trace`` checked against the spikes' shapes; None: fresh (zero) traces."""
    if trace is None:
        return jnp.zeros_like(in_spike), jnp.zeros_like(out_spike)
    for name, spike, state in (("trace_pre", in_spike, trace[0]), ("trace_post", out_spike, trace[1])):
        if jnp.shape(state) != spike.shape:
            raise ValueError(f"{name} is {jnp.shape(state)} but the spikes are {spike.shape}: reset() the learner "
                             "before changing the batch size")
    return trace


def _euler(trace: jax.Array, spike: jax.Array, tau: float) -> jax.Array:
    return trace - trace / tau + spike


def stdp_linear_step(in_spike: jax.Array, out_spike: jax.Array, trace: Trace | None, weight: jax.Array, *,
                     tau_pre: float, tau_post: float, f_pre: Modulation = _identity,
                     f_post: Modulation = _identity) -> tuple[jax.Array, Trace]:
    """One STDP step of a linear layer: ``(delta_w [in, out], (trace_pre [N, in], trace_post [N, out]))``.

    ``in_spike [N, in]``, ``out_spike [N, out]``; ``trace``: ``(trace_pre, trace_post)`` shaped as the spikes, or
    None for fresh traces; ``weight [in, out]`` (``nnx.Linear``'s kernel); ``tau_pre`` / ``tau_post`` in time steps
    (>= 1). ``delta_w = f_post(w) * sum_n trace_pre x out_spike - f_pre(w) * sum_n in_spike x trace_post`` with the
    traces already updated by this step's spikes.
    """
    _check_taus(False, tau_pre=tau_pre, tau_post=tau_post)
    if in_spike.ndim != 2 or out_spike.ndim != 2 or weight.shape != (in_spike.shape[1], out_spike.shape[1]):
        raise ValueError(f"stdp_linear_step: spikes [N, in] {in_spike.shape} and [N, out] {out_spike.shape} do not "
                         f"fit the kernel [in, out] {weight.shape}")
    trace_pre, trace_post = _traces(in_spike, out_spike, trace)
    trace_pre, trace_post = _euler(trace_pre, in_spike, tau_pre), _euler(trace_post, out_spike, tau_post)
    depress = jnp.einsum("ni,no->io", in_spike, trace_post)
    potentiate = jnp.einsum("ni,no->io", trace_pre, out_spike)
    return f_post(weight) * potentiate - f_pre(weight) * depress, (trace_pre, trace_post)


def stdp_conv2d_step(in_spike: jax.Array, out_spike: jax.Array, trace: Trace | None, weight: jax.Array, *,
                     stride: tuple[int, int] = (1, 1), padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0),
                                                                                                            (0, 0)),
                     tau_pre: float, tau_post: float, f_pre: Modulation = _identity,
                     f_post: Modulation = _identity) -> tuple[jax.Array, Trace]:
    """One STDP step of a 2-D convolution: ``(delta_w [kh, kw, in, out], (trace_pre, trace_post))``.

    ``in_spike [N, H, W, in]`` (unpadded; ``padding`` pads it with zeros, whose traces stay zero),
    ``out_spike [N, Ho, Wo, out]``, ``weight [kh, kw, in, out]``, ``stride`` / ``padding`` the convolution's
    (``((top, bottom), (left, right))``); no dilation, one group. Each kernel tap ``(h, w)`` pairs the output at
    ``(y, x)`` with the input at ``(y * sh + h, x * sw + w)``, summed over the batch and positions, as
    ``stdp_linear_step`` does per pair.
    """
    _check_taus(False, tau_pre=tau_pre, tau_post=tau_post)
    if in_spike.ndim != 4 or out_spike.ndim != 4 or weight.ndim != 4 or weight.shape[2:] != (
            in_spike.shape[3], out_spike.shape[3]) or in_spike.shape[0] != out_spike.shape[0]:
        raise ValueError(f"stdp_conv2d_step: spikes [N, H, W, in] {in_spike.shape} and [N, Ho, Wo, out] "
                         f"{out_spike.shape} do not fit the kernel [kh, kw, in, out] {weight.shape}")
    (sh, sw), (kh, kw) = stride, weight.shape[:2]
    pad = ((0, 0), *padding, (0, 0))
    ho, wo = ((d + p0 + p1 - k) // s + 1
              for d, (p0, p1), k, s in zip(in_spike.shape[1:3], padding, (kh, kw), stride, strict=True))
    if out_spike.shape[1:3] != (ho, wo):
        raise ValueError(f"stdp_conv2d_step: a {kh}x{kw} kernel with stride {stride} and padding {padding} maps "
                         f"{in_spike.shape[1:3]} to {(ho, wo)}, but out_spike is {out_spike.shape[1:3]}")
    trace_pre, trace_post = _traces(in_spike, out_spike, trace)
    trace_pre, trace_post = _euler(trace_pre, in_spike, tau_pre), _euler(trace_post, out_spike, tau_post)
    spikes_in, traces_in = jnp.pad(in_spike, pad), jnp.pad(trace_pre, pad)

    def tap(a, h, w):  # the inputs that kernel tap (h, w) reads: [N, Ho, Wo, in]
        return a[:, h:h + (ho - 1) * sh + 1:sh, w:w + (wo - 1) * sw + 1:sw]

    depress = jnp.stack([jnp.stack([jnp.einsum("nyxi,nyxo->io", tap(spikes_in, h, w), trace_post)
                                    for w in range(kw)]) for h in range(kh)])
    potentiate = jnp.stack([jnp.stack([jnp.einsum("nyxi,nyxo->io", tap(traces_in, h, w), out_spike)
                                       for w in range(kw)]) for h in range(kh)])
    return f_post(weight) * potentiate - f_pre(weight) * depress, (trace_pre, trace_post)


def stdp_multistep(rule: Callable[..., tuple[jax.Array, Trace]], in_seq: jax.Array, out_seq: jax.Array,
                   trace: Trace | None, weight: jax.Array, **kwargs) -> tuple[jax.Array, Trace]:
    """``rule`` (``stdp_linear_step`` / ``stdp_conv2d_step``) over ``in_seq [T, ...]`` / ``out_seq [T, ...]`` with
    the weight held fixed: ``(sum of the T deltas, final traces)``; ``kwargs`` go to ``rule``."""
    if in_seq.shape[:1] != out_seq.shape[:1]:
        raise ValueError(f"stdp_multistep: in_seq has {in_seq.shape[:1]} steps, out_seq {out_seq.shape[:1]}")
    trace = _traces(in_seq[0], out_seq[0], trace)

    def one(carry, spikes):
        delta, trace = carry
        d, trace = rule(*spikes, trace, weight, **kwargs)
        return (delta + d, trace), None

    (delta, trace), _ = jax.lax.scan(one, (jnp.zeros_like(weight), trace), (in_seq, out_seq))
    return delta, trace


def mstdp_linear_step(in_spike: jax.Array, out_spike: jax.Array, trace: Trace | None, weight: jax.Array, *,
                      tau_pre: float, tau_post: float, f_pre: Modulation = _identity,
                      f_post: Modulation = _identity) -> tuple[jax.Array, Trace]:
    """One MSTDP eligibility step of a linear layer: ``(eligibility [N, in, out], traces)``, per example (the reward
    weighs it later); traces decay by ``exp(-1 / tau)`` (tau > 0). Shapes as ``stdp_linear_step``."""
    _check_taus(True, tau_pre=tau_pre, tau_post=tau_post)
    if in_spike.ndim != 2 or out_spike.ndim != 2 or weight.shape != (in_spike.shape[1], out_spike.shape[1]):
        raise ValueError(f"mstdp_linear_step: spikes [N, in] {in_spike.shape} and [N, out] {out_spike.shape} do "
                         f"not fit the kernel [in, out] {weight.shape}")
    trace_pre, trace_post = _traces(in_spike, out_spike, trace)
    trace_pre = trace_pre * math.exp(-1 / tau_pre) + in_spike
    trace_post = trace_post * math.exp(-1 / tau_post) + out_spike
    eligibility = (f_post(weight) * (trace_pre[:, :, None] * out_spike[:, None, :])
                   - f_pre(weight) * (in_spike[:, :, None] * trace_post[:, None, :]))
    return eligibility, (trace_pre, trace_post)


def mstdpet_linear_step(in_spike: jax.Array, out_spike: jax.Array, trace: Trace | None, weight: jax.Array, *,
                        tau_pre: float, tau_post: float, f_pre: Modulation = _identity,
                        f_post: Modulation = _identity) -> tuple[jax.Array, Trace]:
    """One MSTDP-ET eligibility step of an unbatched linear layer: ``in_spike [in]``, ``out_spike [out]``,
    ``weight [in, out]`` -> ``(eligibility [in, out], traces)``; traces decay by ``exp(-1 / tau)``."""
    if in_spike.ndim != 1 or out_spike.ndim != 1:
        raise ValueError(f"mstdpet_linear_step: spikes are [in] and [out] (no batch), got {in_spike.shape} and "
                         f"{out_spike.shape}")
    eligibility, trace = mstdp_linear_step(in_spike[None], out_spike[None], None if trace is None else (
        trace[0][None], trace[1][None]), weight, tau_pre=tau_pre, tau_post=tau_post, f_pre=f_pre, f_post=f_post)
    return eligibility[0], (trace[0][0], trace[1][0])


def mstdpet_reward_step(reward: jax.Array | float, eligibility: jax.Array, trace_e: jax.Array, *,
                        tau_trace: float) -> tuple[jax.Array, jax.Array]:
    """The eligibility trace ``trace_e <- trace_e * exp(-1 / tau_trace) + eligibility / tau_trace`` and the weight
    change ``reward * trace_e``: ``(delta_w, trace_e)``."""
    _check_taus(True, tau_trace=tau_trace)
    trace_e = trace_e * math.exp(-1 / tau_trace) + eligibility / tau_trace
    return reward * trace_e, trace_e


class LearnerTrace(nnx.Variable):
    """A learner's trace (or eligibility); a scalar 0 until the first step fixes its shape."""


Records = dict[str, list[jax.Array]]
_KEYS = itertools.count()


class _Learner(nnx.Module, Stateful):
    """What every learner shares: the synapse and neuron it watches, its traces, reset / close."""

    _states: tuple[str, ...] = ("trace_pre", "trace_post")

    def __init__(self, step_mode: str, synapse: nnx.Module, sn: nnx.Module, tau_pre: float, tau_post: float,
                 f_pre: Modulation, f_post: Modulation, *, exponential: bool, modes: tuple[str, ...]):
        _check_taus(exponential, tau_pre=tau_pre, tau_post=tau_post)
        if step_mode not in modes:
            raise ValueError(f"{type(self).__name__}: step_mode must be one of {modes}, got {step_mode!r}")
        if not isinstance(getattr(synapse, "kernel", None), nnx.Param):
            raise TypeError(f"{type(self).__name__}: synapse must be a linear or convolution layer with a kernel, got "
                            f"{type(synapse).__name__}")
        if not isinstance(synapse, (Conv2d, Linear)):
            raise TypeError(f"{type(self).__name__}: the synapse is a {type(synapse).__name__}, whose input record() "
                            "cannot see; build it with snnjax.layers.linear / conv2d")
        if not isinstance(sn, BaseNode):
            raise TypeError(f"{type(self).__name__}: sn must be a spiking neuron (snnjax.neurons), got "
                            f"{type(sn).__name__}")
        self._take(synapse)  # checks the synapse before anything is tagged
        self.step_mode, self.tau_pre, self.tau_post = step_mode, float(tau_pre), float(tau_post)
        self.f_pre, self.f_post = f_pre, f_post
        self.synapse, self.sn = synapse, sn
        self.key = next(_KEYS)
        for module, role in ((synapse, "pre"), (sn, "post")):  # how record() knows them under any transform
            module.stdp_taps = (*getattr(module, "stdp_taps", ()), (self.key, role))
        self.reset()

    def _take(self, synapse: nnx.Module) -> None:
        """Check ``synapse`` (raising NotImplementedError for what the rule cannot learn) and keep its settings."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the traces (SpikingJelly's ``reset()``); weights are untouched."""
        for name in self._states:
            setattr(self, name, LearnerTrace(jnp.zeros((), float)))

    def close(self) -> None:
        """Stop watching the synapse and the neuron (``record`` no longer sees them) and forget the traces."""
        for module in (self.synapse, self.sn):
            taps = tuple(t for t in getattr(module, "stdp_taps", ()) if t[0] != self.key)
            if taps:
                module.stdp_taps = taps
            elif hasattr(module, "stdp_taps"):
                del module.stdp_taps
        self.reset()

    def _state(self, name: str, like: jax.Array) -> jax.Array:
        """Trace ``name`` as an array shaped like ``like`` (zeros while fresh)."""
        value = getattr(self, name).get_value()
        if value.ndim == 0:
            return jnp.zeros_like(like)
        if value.shape != like.shape:
            raise ValueError(f"{type(self).__name__}.{name} is {value.shape} but the spikes are {like.shape}: reset() "
                             "the learner before changing the batch size")
        return value

    def _pairs(self, records: Records) -> list[tuple[jax.Array, jax.Array]]:
        pre, post = records["pre"], records["post"]
        if len(pre) != len(post):
            raise ValueError(f"{type(self).__name__}: {len(pre)} synapse inputs but {len(post)} neuron outputs were "
                             "recorded; the synapse and sn must run equally often")
        return list(zip(pre, post, strict=True))


def _one_step(a: jax.Array, ndim: int, who: str) -> jax.Array:
    """A single-step record ``[N, ...]``; a ``[1, N, ...]`` one (a time-major call with T=1) loses its time axis."""
    if a.ndim == ndim + 1 and a.shape[0] == 1:
        return a[0]
    if a.ndim != ndim:
        raise ValueError(f"{who}: a single-step record is [N, ...] with {ndim} dims (or [1, N, ...]), got {a.shape}")
    return a


class STDPLearner(_Learner):
    """SpikingJelly's ``STDPLearner(step_mode, synapse, sn, tau_pre, tau_post, f_pre, f_post)`` for a linear layer or
    a 2-D convolution.

    ``step_mode``: ``"s"``, each record one step (``[N, ...]``, or ``[1, N, ...]`` from a time-major call with T=1),
    or ``"m"``, each record ``[T, N, ...]``. ``synapse``: an ``snnjax.layers.linear`` / ``conv2d`` (their
    calls are seen by ``record``); ``sn``: the neuron that fires its output spikes. ``tau_pre`` / ``tau_post``: trace
    time constants in steps (>= 1); ``f_pre`` / ``f_post``: elementwise functions of the kernel weighing depression
    and potentiation (e.g. ``lambda w: jnp.clip(w, -1, 1)``).
    """

    def __init__(self, step_mode: str, synapse: nnx.Module, sn: nnx.Module, tau_pre: float, tau_post: float,
                 f_pre: Modulation = _identity, f_post: Modulation = _identity):
        super().__init__(step_mode, synapse, sn, tau_pre, tau_post, f_pre, f_post, exponential=False, modes=("s", "m"))

    def _take(self, synapse: nnx.Module) -> None:
        if isinstance(synapse, nnx.Conv):
            if len(synapse.kernel_size) != 2:
                raise NotImplementedError(f"STDPLearner: a {len(synapse.kernel_size)}-D convolution; only Conv2d")
            dilations = (*_two(synapse.kernel_dilation), *_two(synapse.input_dilation))
            if synapse.feature_group_count != 1 or any(d != 1 for d in dilations):
                raise NotImplementedError("STDPLearner: convolutions need feature_group_count=1 and no dilation")
            self.stride = _two(synapse.strides)
            self.padding = _pairs(synapse.padding)
        elif not isinstance(synapse, nnx.Linear):
            raise NotImplementedError(f"STDPLearner: synapse must be a Linear or Conv2d, got {type(synapse).__name__}")

    def step(self, records: Records, *, scale: float = 1.0) -> jax.Array:
        """The weight change for ``records`` (``record``'s entry for this learner), shaped like the kernel, scaled by
        ``scale``; advances the traces. SpikingJelly's ``step(on_grad=False, scale)``; ``on_grad`` adds it."""
        conv = isinstance(self.synapse, nnx.Conv)
        rule = stdp_conv2d_step if conv else stdp_linear_step
        kwargs = dict(tau_pre=self.tau_pre, tau_post=self.tau_post, f_pre=self.f_pre, f_post=self.f_post)
        if conv:
            kwargs.update(stride=self.stride, padding=self.padding)
        weight = jax.lax.stop_gradient(self.synapse.kernel.get_value())
        delta = jnp.zeros_like(weight)
        for pre, post in self._pairs(records):
            if self.step_mode == "m":
                if pre.ndim != (4 if conv else 2) + 1 or pre.shape[0] != post.shape[0]:
                    raise ValueError(f"STDPLearner: multi-step records are [T, N, ...], got {pre.shape} and "
                                     f"{post.shape}")
                trace = (self._state("trace_pre", pre[0]), self._state("trace_post", post[0]))
                d, trace = stdp_multistep(rule, pre, post, trace, weight, **kwargs)
            else:
                ndim = 4 if conv else 2
                pre, post = _one_step(pre, ndim, "STDPLearner"), _one_step(post, ndim, "STDPLearner")
                trace = (self._state("trace_pre", pre), self._state("trace_post", post))
                d, trace = rule(pre, post, trace, weight, **kwargs)
            self.trace_pre.set_value(trace[0])
            self.trace_post.set_value(trace[1])
            delta = delta + (d * scale if scale != 1.0 else d)
        return delta


def _two(value) -> tuple[int, int]:
    """An ``nnx.Conv`` setting (None, an int or one per spatial dim) for both dims."""
    if value is None:
        return 1, 1
    return (value, value) if isinstance(value, int) else tuple(value)


def _pairs(padding) -> tuple[tuple[int, int], tuple[int, int]]:
    """An ``nnx.Conv``'s 2-D ``padding`` as ``((top, bottom), (left, right))``."""
    if isinstance(padding, str):
        if padding.upper() != "VALID":
            raise NotImplementedError(f"STDPLearner: padding {padding!r}; give explicit pads (conv2d's padding=)")
        return (0, 0), (0, 0)
    if isinstance(padding, int):
        return (padding, padding), (padding, padding)
    pads = [(p, p) if isinstance(p, int) else tuple(p) for p in padding]
    return tuple(pads) if len(pads) == 2 else (pads[0], pads[0])


class MSTDPLearner(_Learner):
    """SpikingJelly's reward-modulated ``MSTDPLearner`` (single-step, linear synapse, spikes ``[N, in]`` /
    ``[N, out]``): the eligibility of step ``t - 1`` weighted by the reward given at step ``t`` (scalar or ``[N]``),
    summed over the batch; the first step's change is zero."""

    _states = ("trace_pre", "trace_post", "eligibility")

    def __init__(self, step_mode: str, synapse: nnx.Module, sn: nnx.Module, tau_pre: float, tau_post: float,
                 f_pre: Modulation = _identity, f_post: Modulation = _identity):
        super().__init__(step_mode, synapse, sn, tau_pre, tau_post, f_pre, f_post, exponential=True, modes=("s",))

    def _take(self, synapse: nnx.Module) -> None:
        if not isinstance(synapse, nnx.Linear):
            raise NotImplementedError(f"{type(self).__name__}: synapse must be a Linear, got {type(synapse).__name__}")

    def _eligibility(self, records: Records, batched: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
        """This step's eligibility and the previous one; advances the neuron traces."""
        pairs = self._pairs(records)
        if len(pairs) != 1:
            raise ValueError(f"{type(self).__name__}.step: exactly one forward step per step, got {len(pairs)}")
        ndim = 2 if batched else 1
        pre, post = (_one_step(a, ndim, type(self).__name__) for a in pairs[0])
        weight = jax.lax.stop_gradient(self.synapse.kernel.get_value())
        rule = mstdp_linear_step if batched else mstdpet_linear_step
        eligibility, (trace_pre, trace_post) = rule(
            pre, post, (self._state("trace_pre", pre), self._state("trace_post", post)), weight,
            tau_pre=self.tau_pre, tau_post=self.tau_post, f_pre=self.f_pre, f_post=self.f_post)
        previous = self._state("eligibility", eligibility)
        self.trace_pre.set_value(trace_pre)
        self.trace_post.set_value(trace_post)
        self.eligibility.set_value(eligibility)
        return eligibility, previous, pre

    def step(self, records: Records, reward: jax.Array | float, *, scale: float = 1.0) -> jax.Array:
        """The weight change (kernel-shaped) for one recorded step and ``reward`` (scalar or ``[N]``)."""
        _, previous, pre = self._eligibility(records, batched=True)
        reward = jnp.asarray(reward, previous.dtype)
        if reward.ndim != 0 and reward.shape != (pre.shape[0],):
            raise ValueError(f"MSTDPLearner.step: reward must be a scalar or [N={pre.shape[0]}], got {reward.shape}")
        delta = jnp.sum(jnp.reshape(reward, (-1, 1, 1)) * previous, axis=0)
        return delta * scale if scale != 1.0 else delta


class MSTDPETLearner(MSTDPLearner):
    """SpikingJelly's ``MSTDPETLearner`` (single-step, linear synapse, unbatched spikes ``[in]`` / ``[out]``): the
    eligibility trace (time constant ``tau_trace``) of the previous steps' eligibilities, times a scalar reward."""

    _states = ("trace_pre", "trace_post", "eligibility", "trace_e")

    def __init__(self, step_mode: str, synapse: nnx.Module, sn: nnx.Module, tau_pre: float, tau_post: float,
                 tau_trace: float, f_pre: Modulation = _identity, f_post: Modulation = _identity):
        _check_taus(True, tau_trace=tau_trace)
        self.tau_trace = float(tau_trace)
        super().__init__(step_mode, synapse, sn, tau_pre, tau_post, f_pre, f_post)

    def step(self, records: Records, reward: jax.Array | float, *, scale: float = 1.0) -> jax.Array:
        """The weight change (kernel-shaped) for one recorded step and a scalar ``reward``."""
        reward = jnp.asarray(reward)
        if reward.ndim != 0:
            raise ValueError(f"MSTDPETLearner.step: reward must be a scalar, got shape {reward.shape}")
        eligibility, previous, _ = self._eligibility(records, batched=False)
        delta, trace_e = mstdpet_reward_step(reward, previous, self._state("trace_e", eligibility),
                                             tau_trace=self.tau_trace)
        self.trace_e.set_value(trace_e)
        return delta * scale if scale != 1.0 else delta


@contextlib.contextmanager
def record(learners: Sequence[_Learner]) -> Iterator[list[Records]]:
    """Within this context, each learner's synapse inputs and neuron outputs (gradients stopped), in call order:
    ``records[i] = {"pre": [...], "post": [...]}`` for ``learners[i]``, filled as the model runs (SpikingJelly's
    input / output monitors). Works inside ``nnx.grad`` / ``nnx.jit`` (modules are matched by the tag each learner
    puts on them, which survives the transforms' copies): return the records from the function, as aux data."""
    records = [{"pre": [], "post": []} for _ in learners]
    index = {learner.key: i for i, learner in enumerate(learners)}

    def seen(module, role, value):
        for key, tap_role in getattr(module, "stdp_taps", ()):
            if tap_role == role and key in index:
                records[index[key]][role].append(jax.lax.stop_gradient(value))

    with observe_inputs(lambda layer, x: seen(layer, "pre", x)), observe(lambda node, s, _: seen(node, "post", s)):
        yield records
    for learner, rec in zip(learners, records, strict=True):
        if not rec["pre"] and not rec["post"]:
            raise ValueError(f"record: the {type(learner).__name__}'s synapse and neuron were not called; is its "
                             "synapse an snnjax.layers.linear / conv2d of the model that ran?")


def on_grad(grads: nnx.State, model: nnx.Module, learner: _Learner, delta: jax.Array, *,
            replace: bool = False) -> nnx.State:
    """``grads`` (``nnx.grad``'s state of ``model``) with ``-delta`` added to the gradient of ``learner``'s synapse
    kernel, so that a gradient-descent step (any optax transformation) applies the learner's change with it:
    SpikingJelly's ``step(on_grad=True)``. ``replace=True`` puts ``-delta`` in place of the gradient (SpikingJelly's
    tutorial zeroes the STDP layers' gradients first)."""
    paths = [path for path, module in nnx.iter_modules(model)
             if (learner.key, "pre") in getattr(module, "stdp_taps", ())]
    if len(paths) != 1:
        raise ValueError(f"on_grad: the learner's synapse is {len(paths)} times in {type(model).__name__}")
    target, found = (*paths[0], "kernel"), []

    def add(path, g):
        keys = tuple(getattr(k, "key", getattr(k, "idx", None)) for k in path
                     if not isinstance(k, jax.tree_util.GetAttrKey))  # a Variable's own node: its value
        if keys != target:
            return g
        found.append(path)
        return -delta.astype(g.dtype) if replace else g - delta.astype(g.dtype)

    out = jax.tree_util.tree_map_with_path(add, grads)
    if not found:
        raise ValueError(f"on_grad: grads hold no gradient for {'.'.join(map(str, target))} (differentiate with "
                         "respect to every nnx.Param of the model)")
    return out
