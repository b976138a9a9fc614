"""Parallel spiking neurons (SpikingJelly's ``PSN``, ``MaskedPSN``, ``SlidingPSN``): one matmul over time.

Each maps ``x_seq [T, ...]`` to spikes ``[T, ...]`` as ``S = surrogate(W @ X + b)``, with ``X`` the input
flattened to ``[T, M]`` and ``W [T, T]`` a learned mixing of the time steps:

- ``PSN(T)``: ``W [T, T]`` and ``b [T, 1]`` learned (``W`` uniform in ``+-1/sqrt(T)``, torch's
  ``kaiming_uniform_(a=sqrt(5))``; ``b = -1``);
- ``MaskedPSN(k, T, lambda_init)``: as PSN, ``W`` multiplied by ``lambda_ M_k + (1 - lambda_)`` with ``M_k`` the
  band of the current and ``k - 1`` previous steps (``W M_k`` once ``lambda_ >= 1``); ``lambda_`` is not learned
  but raised during training by the user (``node.lambda_.set_value(...)``), as SpikingJelly's;
- ``SlidingPSN(k, exp_init)``: ``W[i, j] = w[k - 1 - (i - j)]`` for ``0 <= i - j < k`` from ``w [k]`` and a
  scalar ``b``, any T; ``w = (2^-(k-1), ..., 1/2, 1)`` with ``exp_init``, else uniform in ``+-1/sqrt(k)``.

SpikingJelly's keywords and defaults (``surrogate_function=ATan()``); parameters in SpikingJelly's shapes
(``weight``, ``bias``). ``SlidingPSN`` runs both step modes (its default ``'s'`` keeps the last ``k`` inputs);
``PSN`` is multi-step only (as SpikingJelly's) and ``MaskedPSN`` too here: SpikingJelly's single-step mode of it
(only for ``lambda_ >= 1``) is not built, so it needs ``step_mode='m'`` (an error says so rather than reading
``[N, ...]`` as time); both take exactly ``T`` steps. The matmul runs at the highest precision (float32 inputs
are not rounded to bfloat16 on accelerators). They have no membrane potential: ``snnjax.monitor`` and streaming
inference, which read and carry one per neuron, see only the recurrent neurons (``modules.BaseNode``); a model
whose output at step t depends on later steps (``PSN``, ``MaskedPSN`` with ``lambda_ < 1``) cannot stream.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax.neurons import modules
from snnjax.neurons import surrogate as sg


class PSNQueue(modules.MembranePotential):
    """``SlidingPSN``'s single-step state: its last ``k`` inputs ``[k, ...]`` (zeros before the first ones), a
    ``MembranePotential`` so that the streaming-state filters and ``reset_net`` find it."""


class PSNLambda(nnx.Variable):
    """``MaskedPSN``'s mask mixing ``lambda_``: state the user schedules, not a learned parameter."""


def _check(surrogate_function: sg.Surrogate, step_mode: str, name: str, modes: tuple[str, ...] = ("m",)) -> None:
    if step_mode not in modes:
        if step_mode == "s":
            raise ValueError(f"{name}: step_mode='s' (SpikingJelly's default; its single-step mode needs lambda_ >= 1 "
                             "and keeps a queue of past inputs) is not built in snnjax; pass step_mode='m' (input "
                             "[T, ...])")
        raise ValueError(f"{name}: step_mode must be one of {modes}, got {step_mode!r}")
    sg.refuse_random(surrogate_function, name)


def _uniform(rngs: nnx.Rngs | None, shape: tuple[int, ...], fan_in: int, name: str) -> jax.Array:
    """torch's ``kaiming_uniform_(a=sqrt(5))``: uniform in ``+-1/sqrt(fan_in)``, in the default float dtype."""
    if rngs is None:
        raise ValueError(f"{name} draws its initial weights: pass rngs=nnx.Rngs(...)")
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(rngs.params(), shape, dtype=float, minval=-bound, maxval=bound)


class _ParallelNode(nnx.Module):
    """What the three share: ``H = W X + b`` over ``[T, M]`` (``gemm_weight(T)``: ``W [T, T]``), the surrogate."""

    def gemm_bias(self) -> jax.Array:
        """``b``, broadcastable to ``[T, 1]``."""
        return self.bias[...]

    def __call__(self, x_seq: jax.Array) -> jax.Array:
        """Spikes ``[T, ...]`` for ``x_seq [T, ...]`` (the surrogate's output dtype: x's for float inputs)."""
        T = x_seq.shape[0]
        weight = self.gemm_weight(T)
        h = jnp.matmul(weight.astype(x_seq.dtype), x_seq.reshape(T, -1), precision=jax.lax.Precision.HIGHEST)
        h = (self.gemm_bias().astype(x_seq.dtype) + h).reshape(x_seq.shape)
        return self.surrogate_function(h)


class PSN(_ParallelNode):
    """SpikingJelly's ``PSN(T, surrogate_function=ATan())``: ``S = sg(W X + b)``, ``W [T, T]``, ``b [T, 1]``."""

    step_mode = "m"  # SpikingJelly's PSN is multi-step only and takes no step_mode

    def __init__(self, T: int, surrogate_function: sg.Surrogate = sg.ATan(), *, rngs: nnx.Rngs | None = None):
        _check(surrogate_function, "m", "PSN")
        self.T = int(T)
        self.surrogate_function = surrogate_function
        self.weight = nnx.Param(_uniform(rngs, (self.T, self.T), self.T, "PSN"))
        self.bias = nnx.Param(jnp.full((self.T, 1), -1.0, dtype=float))

    def gemm_weight(self, T: int) -> jax.Array:
        if T != self.T:
            raise ValueError(f"PSN(T={self.T}) takes inputs of exactly {self.T} steps, got T={T}")
        return self.weight[...]


class MaskedPSN(_ParallelNode):
    """SpikingJelly's ``MaskedPSN(k, T, lambda_init=0.0, surrogate_function=ATan(), step_mode)``."""

    def __init__(self, k: int, T: int, lambda_init: float = 0.0, surrogate_function: sg.Surrogate = sg.ATan(),
                 step_mode: str = "s", *, rngs: nnx.Rngs | None = None):
        _check(surrogate_function, step_mode, "MaskedPSN")
        self.k, self.T = int(k), int(T)
        self.surrogate_function = surrogate_function
        self.step_mode = step_mode
        self.weight = nnx.Param(_uniform(rngs, (self.T, self.T), self.T, "MaskedPSN"))
        self.bias = nnx.Param(jnp.full((self.T, 1), -1.0, dtype=float))
        self.lambda_ = PSNLambda(jnp.asarray(lambda_init, dtype=float))

    def mask(self) -> jax.Array:
        """``M_k [T, T]``: 1 where ``0 <= i - j < k`` (the step and its ``k - 1`` predecessors)."""
        d = jnp.arange(self.T)[:, None] - jnp.arange(self.T)[None, :]
        return ((d >= 0) & (d < self.k)).astype(self.weight[...].dtype)

    def gemm_weight(self, T: int) -> jax.Array:
        if T != self.T:
            raise ValueError(f"MaskedPSN(T={self.T}) takes inputs of exactly {self.T} steps, got T={T}")
        w, m, lam = self.weight[...], self.mask(), self.lambda_[...].astype(self.weight[...].dtype)
        return jnp.where(lam >= 1.0, w * m, (lam * m + (1.0 - lam)) * w)


class SlidingPSN(_ParallelNode, modules.Stateful):
    """SpikingJelly's ``SlidingPSN(k, exp_init=True, surrogate_function=ATan(), step_mode='s')``: ``w [k]``, ``b`` a
    scalar. Single-step mode (``'s'``) keeps the last ``k`` inputs (``queue``) across calls until ``reset()``
    (or ``reset_net``): step ``t``'s spikes are ``sg(sum_i w[i] X_{t - k + 1 + i} + b)``, as the multi-step
    mode's row ``t``."""

    def __init__(self, k: int, exp_init: bool = True, surrogate_function: sg.Surrogate = sg.ATan(),
                 step_mode: str = "s", *, rngs: nnx.Rngs | None = None):
        _check(surrogate_function, step_mode, "SlidingPSN", ("s", "m"))
        self.k = int(k)
        self.exp_init = exp_init
        self.surrogate_function = surrogate_function
        self.step_mode = step_mode
        if exp_init:
            weight = 0.5 ** jnp.arange(self.k - 1, -1, -1, dtype=float)
        else:
            weight = _uniform(rngs, (self.k,), self.k, "SlidingPSN(exp_init=False)")
        self.weight = nnx.Param(weight)
        self.bias = nnx.Param(jnp.asarray(-1.0, dtype=float))
        self.queue = PSNQueue(jnp.zeros((), dtype=float))

    def __call__(self, x: jax.Array) -> jax.Array:
        """Spikes for ``x`` (``[T, ...]`` in multi-step mode, one step ``[...]`` in single-step mode)."""
        return super().__call__(x) if self.step_mode == "m" else self.single_step(x)

    def single_step(self, x: jax.Array) -> jax.Array:
        """One step ``x [...]``: pushes it onto the queue (dropping the oldest) and returns its spikes ``[...]``."""
        queue = jnp.broadcast_to(self.queue.get_value(), (self.k, *x.shape)).astype(x.dtype)
        queue = jnp.concatenate([queue[1:], x[None]])
        w = self.weight[...].astype(x.dtype).reshape((self.k,) + (1,) * x.ndim)
        self.queue.set_value(queue)
        return self.surrogate_function(jnp.sum(w * queue, axis=0) + self.bias[...].astype(x.dtype))

    def reset(self) -> None:
        """Forget the queue (SpikingJelly's ``reset()``)."""
        self.queue.set_value(jnp.zeros((), dtype=float))

    def gemm_weight(self, T: int) -> jax.Array:
        """``W[i, j] = w[k - 1 - (i - j)]`` for ``0 <= i - j < k``, else 0."""
        d = jnp.arange(T)[:, None] - jnp.arange(T)[None, :]
        inside = (d >= 0) & (d < self.k)
        return jnp.where(inside, self.weight[...][jnp.clip(self.k - 1 - d, 0, self.k - 1)], 0.0)
