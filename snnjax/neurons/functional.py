"""Pure functional core of IF / LIF / PLIF neurons, with SpikingJelly's semantics.

For each step t, with ``vr = v_reset if v_reset is not None else 0``:
  charge  IF:   H = V + X
          LIF:  H = V + (X - (V - vr)) / tau         (decay_input=True)
                H = V - (V - vr) / tau + X           (decay_input=False)
          PLIF: as LIF with 1/tau = k = sigmoid(w), w a learned scalar
  fire    S = 1[H >= v_threshold], backward via the surrogate sg'(H - v_threshold)
  reset   hard: V = S v_reset + (1 - S) H;  soft (v_reset=None): V = H - S v_threshold
          (S detached from the graph when detach_reset)

Shapes: multi-step inputs are time-major ``[T, ...]`` with any trailing shape;
the state ``V`` has the trailing shape. The state is kept in
``state_dtype(x.dtype)`` (float32 for bfloat16/float16 inputs); spikes and input
gradients come back in the input dtype.

``multistep`` runs the sequence with ``lax.scan`` and a hand-written
``custom_vjp`` backward (the reverse recurrence of the design notes), storing
only H as residual; with ``impl="pallas"`` (or ``"auto"`` on GPU) it runs the
fused kernels of ``snnjax.pallas`` instead. ``multistep_reference`` is the same
forward differentiated by plain autodiff, kept for tests.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Literal

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

    @property
    def vr(self) -> float:
        """The reset potential as a number (0 for soft reset)."""
        return 0.0 if self.v_reset is None else float(self.v_reset)


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


def reset(cfg: NeuronConfig, h: jax.Array, s: jax.Array) -> jax.Array:
    """V after firing, from H and spikes S (S already detached if wanted)."""
    if cfg.v_reset is None:
        return h - s * cfg.v_threshold
    return (1.0 - s) * h + s * cfg.v_reset


def step(cfg: NeuronConfig, x: jax.Array, v: jax.Array, w: jax.Array | None = None):
    """One time step, differentiable by autodiff through the surrogate.

    Args: ``x`` input current ``[...]``; ``v`` state broadcastable to ``x``.
    Returns: ``(spikes [...] in x.dtype, new state [...] in state dtype)``.
    """
    check_decay_param(cfg, w)
    sdt = state_dtype(x.dtype)
    h = charge(cfg, v.astype(sdt), x.astype(sdt), w)
    s = sg.spike(h - cfg.v_threshold, cfg.surrogate)
    v_new = reset(cfg, h, jax.lax.stop_gradient(s) if cfg.detach_reset else s)
    return s.astype(x.dtype), v_new


def initial_state(cfg: NeuronConfig, shape, dtype) -> jax.Array:
    """Fresh membrane potential (``v_reset``, or 0 for soft reset) of ``shape``."""
    return jnp.full(shape, cfg.vr, state_dtype(dtype))


def _broadcast_state(cfg, x_seq, v_init):
    sdt = state_dtype(x_seq.dtype)
    if v_init is None:
        return initial_state(cfg, x_seq.shape[1:], x_seq.dtype)
    return jnp.broadcast_to(jnp.asarray(v_init, sdt), x_seq.shape[1:])


def multistep_reference(cfg: NeuronConfig, x_seq: jax.Array, v_init=None, w=None, *, return_v_seq=False):
    """Plain-autodiff multi-step neuron (the reference for the custom-vjp path).

    Returns ``(spikes [T, ...], v)`` where ``v`` is the state sequence ``[T, ...]`` if
    ``return_v_seq`` else the final state ``[...]``.
    """
    check_decay_param(cfg, w)
    v0 = _broadcast_state(cfg, x_seq, v_init)

    def body(v, x):
        s, v = step(cfg, x, v, w)
        return v, (s, v if return_v_seq else None)

    v_last, (spikes, v_seq) = jax.lax.scan(body, v0, x_seq)
    return spikes, (v_seq if return_v_seq else v_last)


IMPLS = ("auto", "xla", "pallas", "native")


# ``auto`` picks the fused kernels of the backend: Pallas on a GPU (compiled there, jax 0.11.2 on an H100,
# they matched this path bit for bit over every variant, ``python -m snnjax.pallas.check``, and ran LIF
# forward + backward 3.1-3.3x faster) and the native C++ kernels on a CPU (same spikes as this path; see
# ``snnjax.native``). Under a multi-device layout (a ``snnjax.parallel`` plan active while the step is
# traced) ``auto`` keeps this path, which the SPMD partitioner shards like any elementwise op; an opaque
# kernel call would have its operands gathered. Measurements: ``python -m snnjax.bench.neuron``, records
# in benchmarks/results/. A single step (T = 1) has no time loop to fuse, and XLA fuses its elementwise
# update into the neighbouring ops, which an opaque kernel call would prevent: ``auto`` keeps this path.
AUTO_PALLAS_ON_GPU = True
AUTO_NATIVE_ON_CPU = True


def resolve_impl(impl: str, cfg: NeuronConfig, x_seq) -> str:
    """``"xla"``, ``"pallas"`` or ``"native"`` for an ``impl`` choice (``auto``: see ``AUTO_PALLAS_ON_GPU``).

    An explicit ``"pallas"`` or ``"native"`` that cannot run this call raises ValueError saying why
    (``snnjax.native.build.NativeBuildError`` where the native kernels cannot be compiled).
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "xla":
        return "xla"
    backend = jax.default_backend()
    shape, dtype = jnp.shape(x_seq), jnp.result_type(x_seq)
    if impl == "auto":
        wanted = ("pallas" if backend == "gpu" and AUTO_PALLAS_ON_GPU
                  else "native" if backend == "cpu" and AUTO_NATIVE_ON_CPU else None)
        if wanted is None or shape[:1] in ((), (1,)):
            return "xla"
        from snnjax.parallel import logical  # noqa: PLC0415 (parallel imports the models, hence this module)

        if logical.is_partitioned():
            return "xla"
    else:
        wanted = impl
    if wanted == "pallas":
        from snnjax import pallas  # noqa: PLC0415 (pallas imports this module)

        reason = pallas.unsupported_reason(cfg, shape, dtype)
    else:
        from snnjax.native import build, neuron  # noqa: PLC0415 (native imports this module)

        reason = neuron.unsupported_reason(cfg, shape, dtype)
        if reason is None and backend != "cpu":
            reason = f"the native kernels run on the CPU backend, this is {backend!r}"
        if reason is None and impl == "auto" and not build.available():
            return "xla"
    if reason is None:
        return wanted
    if impl == wanted:
        raise ValueError(f"impl={impl!r} cannot run this neuron call: {reason}; use impl='xla' (or 'auto')")
    return "xla"


def multistep(cfg: NeuronConfig, x_seq: jax.Array, v_init=None, w=None, *, return_v_seq=False, impl="auto"):
    """Multi-step neuron with a hand-written reverse-recurrence backward.

    Same contract as ``multistep_reference``; gradients flow to ``x_seq``,
    ``v_init`` and PLIF's ``w``. ``impl``: ``"xla"`` (``lax.scan``, storing H),
    ``"pallas"`` (the fused kernels of ``snnjax.pallas``, run with ``interpret=True`` on
    a CPU backend), ``"native"`` (the fused C++ kernels of ``snnjax.native``, CPU only) or
    ``"auto"`` (Pallas on one GPU, native on one CPU device, XLA for a single step or under a
    multi-device layout); all give the same spikes and states, and gradients equal to rounding.
    """
    check_decay_param(cfg, w)
    chosen = resolve_impl(impl, cfg, x_seq)
    if chosen == "pallas":
        from snnjax import pallas  # noqa: PLC0415

        return pallas.multistep(cfg, x_seq, v_init, w, return_v_seq=return_v_seq)
    if chosen == "native":
        from snnjax.native import neuron  # noqa: PLC0415

        return neuron.multistep(cfg, x_seq, v_init, w, return_v_seq=return_v_seq)
    v0 = _broadcast_state(cfg, x_seq, v_init)
    return _multistep(cfg, return_v_seq, x_seq, v0, w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _multistep(cfg, return_v_seq, x_seq, v0, w):
    out, _ = _forward(cfg, return_v_seq, x_seq, v0, w)
    return out


def _forward(cfg, return_v_seq, x_seq, v0, w):
    sdt = v0.dtype

    def body(v, x):
        h = charge(cfg, v, x.astype(sdt), w)
        s = (h >= cfg.v_threshold).astype(sdt)
        v = reset(cfg, h, s)
        return v, (s.astype(x_seq.dtype), h, v if return_v_seq else None)

    v_last, (spikes, h_seq, v_seq) = jax.lax.scan(body, v0, x_seq)
    out = (spikes, v_seq if return_v_seq else v_last)
    # x is needed again only for PLIF's dw with decay_input.
    x_res = x_seq if (cfg.kind == "PLIF" and cfg.decay_input) else None
    return out, (h_seq, x_res, v0, w)


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


def _bwd(cfg, return_v_seq, res, cts):
    h_seq, x_res, v0, w = res
    k = decay_rate(cfg, w)
    ds_seq, dv_out = cts
    sdt = h_seq.dtype
    x_dtype = ds_seq.dtype
    carry_factor = 1.0 if cfg.kind == "IF" else 1.0 - k  # dH_{t+1}/dV_t
    plif = cfg.kind == "PLIF"

    def grads_at(dv_carry, h, ds, dv_direct):
        dv = dv_carry if dv_direct is None else dv_carry + dv_direct
        g = cfg.surrogate.grad(h - cfg.v_threshold)
        s = (h >= cfg.v_threshold).astype(sdt)
        return ds.astype(sdt) * g + dv * dv_dh(cfg, h, s, g)

    if plif:
        v_prev = jnp.concatenate([v0[None], reset(cfg, h_seq[:-1], (h_seq[:-1] >= cfg.v_threshold).astype(sdt))])
    xs = (h_seq, ds_seq, dv_out if return_v_seq else None, v_prev if plif else None, x_res)

    def body(carry, inp):
        dv_carry, dk = carry
        h, ds, dv_direct, vp, x = inp
        dh = grads_at(dv_carry, h, ds, dv_direct)
        if plif:
            dh_dk = -(vp - cfg.vr) if x is None else x.astype(sdt) - (vp - cfg.vr)
            dk = dk + jnp.sum(dh * dh_dk)
        return (dh * carry_factor, dk), dx_from_dh(cfg, dh, k).astype(x_dtype)

    dv_start = jnp.zeros_like(v0) if return_v_seq else dv_out.astype(sdt)
    (dv0, dk), dx_seq = jax.lax.scan(body, (dv_start, jnp.zeros((), sdt)), xs, reverse=True)
    return dx_seq, dv0, plif_dw(cfg, w, dk)


_multistep.defvjp(_forward, _bwd)
