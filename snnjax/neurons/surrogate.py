"""Surrogate functions: every one of SpikingJelly 2.0.0's ``activation_based.surrogate``, with its class name,
keywords and defaults.

A surrogate is a frozen (hashable) dataclass, so it can be a static argument of jitted and
custom-differentiated functions. Calling it, ``surrogate(x)``, is SpikingJelly's ``forward``:

- ``spiking=True`` (the default): the Heaviside step ``1[x >= 0]`` (SpikingJelly's ``heaviside``) whose
  derivative is ``grad(x)``, the surrogate derivative, in SpikingJelly's formula and operation order;
- ``spiking=False``: ``primitive(x)``, the smooth function (differentiated by autodiff), as SpikingJelly's
  non-spiking mode.

``derivative(x)`` is the derivative of that call (``grad`` when spiking), which the hand-written backward
of the ``xla`` neuron path uses. ``heaviside`` says whether the call's values are the step ``1[x >= 0]``
(the fused kernels need that). Three surrogates depart from the plain step:

- ``MultiLevelSpikeCount(max_spike_count)``: spiking forward ``round(clamp(x, 0, max_spike_count))``;
- ``PoissonPass()``: spiking forward ``bernoulli(x)``, random, so it takes a JAX key: ``PoissonPass()(x, key)``
  (the neurons refuse it: they have no key to give);
- ``DeterministicPass()`` / ``PoissonPass()`` with ``spiking=False``: the identity.

``SuperSpike`` and ``FakeNumericalGradient`` have no primitive function in SpikingJelly, so no
``spiking=False`` (``FakeNumericalGradient`` takes no ``spiking`` keyword there either).
``get(name, alpha, **params)`` builds one by its registry name (``SURROGATES``), as configs name them.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import ClassVar, Protocol

import jax
import jax.numpy as jnp

__all__ = [
    "ATan", "DeterministicPass", "Erf", "FakeNumericalGradient", "LeakyKReLU", "LogTailedReLU", "MultiLevelSpikeCount",
    "NonzeroSignLogAbs", "PiecewiseExp", "PiecewiseLeakyReLU", "PiecewiseQuadratic", "PoissonPass", "QPseudoSpike",
    "Rect", "S2NN", "SURROGATES", "Sigmoid", "SoftSign", "SquarewaveFourierSeries", "SuperSpike", "Surrogate", "get",
    "name_of", "params_of", "refuse_random", "spike",
]


class Surrogate(Protocol):
    """What a neuron needs of a surrogate function (see the module docstring)."""

    spiking: bool

    def __call__(self, x: jax.Array) -> jax.Array: ...

    def grad(self, x: jax.Array) -> jax.Array: ...

    def derivative(self, x: jax.Array) -> jax.Array: ...

    @property
    def heaviside(self) -> bool: ...


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def spike(x: jax.Array, surrogate: Surrogate) -> jax.Array:
    """Heaviside step ``1[x >= 0]`` (in x's dtype) whose derivative is ``surrogate.grad(x)``."""
    return (x >= 0).astype(x.dtype)


@spike.defjvp
def _spike_jvp(surrogate, primals, tangents):
    (x,), (dx,) = primals, tangents
    return spike(x, surrogate), surrogate.grad(x) * dx


def refuse_random(surrogate: Surrogate, name: str) -> None:
    """Raise ValueError if ``surrogate`` draws random spikes (``PoissonPass``): a neuron ``name`` has no key to give
    it."""
    if getattr(surrogate, "needs_key", False):
        raise ValueError(f"{name}: surrogate_function={surrogate!r} draws random spikes and the neuron has no key to "
                         "give it; call it directly, surrogate(x, key), or choose a deterministic surrogate")


def _sign(x: jax.Array) -> jax.Array:
    """SpikingJelly's ``heaviside(x) * 2 - 1``: +1 where ``x >= 0``, else -1."""
    return jnp.where(x >= 0, 1.0, -1.0).astype(x.dtype)


def _clamp(x: jax.Array, lo: float, hi: float) -> jax.Array:
    """``clip(x, lo, hi)`` whose derivative is 1 on ``[lo, hi]`` inclusive, as torch's clamp (autodiff of
    ``jnp.clip`` gives 1/2 where ``x`` equals an end)."""
    return jnp.where((x >= lo) & (x <= hi), x, jnp.clip(x, lo, hi))


class _Base:
    """The calls every surrogate shares; a subclass defines ``grad`` and, unless it has none, ``primitive``."""

    has_primitive: ClassVar[bool] = True

    def __post_init__(self):
        if not self.spiking and not self.has_primitive:
            raise ValueError(f"{type(self).__name__} has no primitive function (SpikingJelly defines none), so no "
                             "spiking=False; use spiking=True")
        self.check()

    def check(self) -> None:
        """Validate the parameters (SpikingJelly's asserts); subclasses override."""

    @property
    def heaviside(self) -> bool:
        """Whether ``self(x)`` is the step ``1[x >= 0]`` (what the fused kernels compute)."""
        return self.spiking

    @property
    def needs_key(self) -> bool:
        """Whether ``self(x, key)`` draws random numbers (``PoissonPass`` while spiking)."""
        return False

    def __call__(self, x: jax.Array) -> jax.Array:
        """SpikingJelly's forward: the step with derivative ``grad`` if ``spiking``, else ``primitive(x)``."""
        return spike(x, self) if self.spiking else self.primitive(x)

    def derivative(self, x: jax.Array) -> jax.Array:
        """The derivative of ``self(x)``: ``grad(x)`` if ``spiking``, else the primitive's (autodiff)."""
        if self.spiking:
            return self.grad(x)
        return jax.jvp(self.primitive, (x,), (jnp.ones_like(x),))[1]


@dataclasses.dataclass(frozen=True)
class PiecewiseQuadratic(_Base):
    """``sg'(x) = alpha - alpha^2 |x|`` for ``|x| <= 1/alpha``, else 0."""

    alpha: float = 1.0
    spiking: bool = True

    def grad(self, x):
        ax = jnp.abs(x)
        return jnp.where(ax > 1.0 / self.alpha, 0.0, -self.alpha**2 * ax + self.alpha).astype(x.dtype)

    def primitive(self, x):
        a = self.alpha
        inside = (jnp.abs(x) <= 1.0 / a).astype(x.dtype)
        return (x > 1.0 / a).astype(x.dtype) + inside * (-a**2 / 2 * jnp.square(x) * jnp.sign(x) + a * x + 0.5)


@dataclasses.dataclass(frozen=True)
class PiecewiseExp(_Base):
    """``sg'(x) = (alpha / 2) exp(-alpha |x|)``."""

    alpha: float = 1.0
    spiking: bool = True

    def grad(self, x):
        return self.alpha / 2 * jnp.exp(-self.alpha * jnp.abs(x))

    def primitive(self, x):
        sign = _sign(x)
        return (x >= 0).astype(x.dtype) - jnp.exp(sign * x * -self.alpha) / 2.0 * sign


@dataclasses.dataclass(frozen=True)
class Sigmoid(_Base):
    """``sg(x) = sigmoid(alpha x)``; ``sg'(x) = alpha sigmoid(alpha x) (1 - sigmoid(alpha x))``."""

    alpha: float = 4.0
    spiking: bool = True

    def grad(self, x):
        s = jax.nn.sigmoid(x * self.alpha)
        return (1.0 - s) * s * self.alpha

    def primitive(self, x):
        return jax.nn.sigmoid(x * self.alpha)


@dataclasses.dataclass(frozen=True)
class SoftSign(_Base):
    """``sg(x) = (alpha x / (1 + |alpha x|) + 1) / 2``; ``sg'(x) = 1 / (2 alpha (1/alpha + |x|)^2)``; alpha > 0."""

    alpha: float = 2.0
    spiking: bool = True

    def check(self):
        if not self.alpha > 0:
            raise ValueError(f"SoftSign needs alpha > 0, got alpha={self.alpha}")

    def grad(self, x):
        return 1.0 / (2 * self.alpha * jnp.square(1 / self.alpha + jnp.abs(x)))

    def primitive(self, x):
        ax = x * self.alpha
        return (ax / (1.0 + jnp.abs(ax)) + 1.0) / 2.0


@dataclasses.dataclass(frozen=True)
class SuperSpike(_Base):
    """``sg'(x) = alpha / (|x| + 1)^2`` (SuperSpike, Zenke & Ganguli); no primitive function, so spiking only."""

    has_primitive: ClassVar[bool] = False
    alpha: float = 1.0
    spiking: bool = True

    def grad(self, x):
        return self.alpha / jnp.square(jnp.abs(x) + 1.0)


@dataclasses.dataclass(frozen=True)
class ATan(_Base):
    """``sg(x) = atan(pi/2 alpha x) / pi + 1/2``; ``sg'(x) = (alpha/2) / (1 + (pi/2 alpha x)^2)``."""

    alpha: float = 2.0
    spiking: bool = True

    def grad(self, x):
        a = self.alpha / 2
        ax = math.pi * a * x
        return a / (1 + ax * ax)

    def primitive(self, x):
        return jnp.arctan(math.pi / 2 * self.alpha * x) / math.pi + 0.5


@dataclasses.dataclass(frozen=True)
class NonzeroSignLogAbs(_Base):
    """``sg'(x) = 1 / (1/alpha + |x|)``; primitive ``sign(x) log(alpha |x| + 1)`` (sign +1 at 0)."""

    alpha: float = 1.0
    spiking: bool = True

    def grad(self, x):
        return 1.0 / (1 / self.alpha + jnp.abs(x))

    def primitive(self, x):
        sign = _sign(x)
        return sign * jnp.log(self.alpha * sign * x + 1)


@dataclasses.dataclass(frozen=True)
class Erf(_Base):
    """``sg(x) = erfc(-alpha x) / 2``; ``sg'(x) = alpha / sqrt(pi) exp(-(alpha x)^2)``."""

    alpha: float = 2.0
    spiking: bool = True

    def grad(self, x):
        return jnp.exp(-jnp.square(x * self.alpha)) * (self.alpha / math.sqrt(math.pi))

    def primitive(self, x):
        return jax.scipy.special.erfc(-self.alpha * x) / 2.0


@dataclasses.dataclass(frozen=True)
class PiecewiseLeakyReLU(_Base):
    """``sg'(x) = 1 / (2w)`` for ``|x| < w``, else ``c``; w > 0."""

    w: float = 1.0
    c: float = 0.01
    spiking: bool = True

    def check(self):
        if not self.w > 0:
            raise ValueError(f"PiecewiseLeakyReLU needs w > 0, got w={self.w}")

    def grad(self, x):
        return jnp.where(jnp.abs(x) < self.w, 1 / (2 * self.w), self.c).astype(x.dtype)

    def primitive(self, x):
        w, c = self.w, self.c
        middle = x / (2 * w) + 1 / 2
        return jnp.where(x < -w, c * x + c * w, jnp.where(x > w, c * x + (-c * w + 1), middle))


@dataclasses.dataclass(frozen=True)
class SquarewaveFourierSeries(_Base):
    """``sg'(x) = 4 / T_period sum_{i=1}^{n-1} cos((2i - 1) 2 pi x / T_period)``; n an integer, T_period > 0."""

    n: int = 2
    T_period: float = 8.0
    spiking: bool = True

    def check(self):
        if isinstance(self.n, bool) or not isinstance(self.n, int) or not self.T_period > 0:
            raise ValueError(f"SquarewaveFourierSeries needs an integer n and T_period > 0, got n={self.n!r}, "
                             f"T_period={self.T_period}")

    def grad(self, x):
        w = math.pi * 2.0 / self.T_period
        out = jnp.zeros_like(x)
        for i in range(1, self.n):
            out = out + jnp.cos((2 * i - 1.0) * w * x)
        return out * (4.0 / self.T_period)

    def primitive(self, x):
        w = math.pi * 2.0 / self.T_period
        total = jnp.zeros_like(x)
        for i in range(1, self.n):
            c = 2 * i - 1.0
            total = total + jnp.sin(c * w * x) / c
        return 0.5 + 2.0 / math.pi * total


@dataclasses.dataclass(frozen=True)
class S2NN(_Base):
    """``sg'(x) = alpha sigmoid(alpha x) (1 - sigmoid(alpha x))`` for ``x < 0``, ``beta / (x + 1)`` for ``x >= 0``."""

    alpha: float = 4.0
    beta: float = 1.0
    spiking: bool = True

    def grad(self, x):
        s = jax.nn.sigmoid(self.alpha * x)
        # x + 1 is not zero for x >= 0; the other branch's value is discarded (a safe denominator keeps it finite).
        return jnp.where(x < 0.0, self.alpha * s * (1.0 - s), self.beta / jnp.where(x < 0.0, 1.0, x + 1.0))

    def primitive(self, x):
        return jnp.where(x < 0.0, jax.nn.sigmoid(x * self.alpha),
                         self.beta * jnp.log(jnp.abs(x + 1.0) + 1e-05) + 0.5)


@dataclasses.dataclass(frozen=True)
class QPseudoSpike(_Base):
    """``sg'(x) = (1 + 2 |x| / (alpha - 1))^(-alpha)`` (the q-PseudoSpike tail); alpha > 1."""

    alpha: float = 2.0
    spiking: bool = True

    def check(self):
        if not self.alpha > 1:
            raise ValueError(f"QPseudoSpike needs alpha > 1 (it divides by alpha - 1), got alpha={self.alpha}")

    def grad(self, x):
        return jnp.power(1 + 2 / (self.alpha - 1) * jnp.abs(x), -self.alpha)

    def primitive(self, x):
        sign = _sign(x)
        tail = 0.5 * jnp.power(1.0 + 2.0 / (self.alpha - 1.0) * x * sign, 1.0 - self.alpha)
        return (x >= 0).astype(x.dtype) - sign * tail


@dataclasses.dataclass(frozen=True)
class LeakyKReLU(_Base):
    """``sg'(x) = k`` for ``x >= 0``, else ``leak``; primitive ``k x`` / ``leak x``."""

    leak: float = 0.0
    k: float = 1.0
    spiking: bool = True

    def grad(self, x):
        mask = (x >= 0.0).astype(x.dtype)
        return mask * self.k + (1.0 - mask) * self.leak

    def primitive(self, x):
        mask = (x >= 0.0).astype(x.dtype)
        return (self.leak * (1.0 - mask) + self.k * mask) * x


@dataclasses.dataclass(frozen=True)
class FakeNumericalGradient(_Base):
    """``sg'(x) = min(sign(x) / x, alpha)`` (sign +1 at 0, so ``alpha`` at 0); spiking only, as SpikingJelly's,
    which takes no ``spiking`` keyword."""

    has_primitive: ClassVar[bool] = False
    spiking: ClassVar[bool] = True
    alpha: float = 0.3

    def grad(self, x):
        return jnp.minimum(_sign(x) / x, self.alpha)


@dataclasses.dataclass(frozen=True)
class LogTailedReLU(_Base):
    """``sg'(x) = alpha`` for ``x <= 0``, 1 on ``(0, 1]``, ``1 / x`` above 1 (the log-tailed ReLU)."""

    alpha: float = 0.0
    spiking: bool = True

    def grad(self, x):
        return jnp.where(x > 1.0, 1.0 / jnp.maximum(x, 1.0), jnp.where(x <= 0.0, self.alpha, 1.0)).astype(x.dtype)

    def primitive(self, x):
        return jnp.where(x > 1.0, jnp.log(jnp.maximum(x, 1.0)) + 1.0, jnp.where(x > 0, x, x * self.alpha))


@dataclasses.dataclass(frozen=True)
class DeterministicPass(_Base):
    """The step with the straight-through derivative 1; ``spiking=False``: the identity."""

    spiking: bool = True

    def grad(self, x):
        return jnp.ones_like(x)

    def primitive(self, x):
        return x


def _round_half_even(x: jax.Array) -> jax.Array:
    """``jnp.round`` (half to even) from ``floor``: the same values, and Pallas' Triton lowering (the GPU kernels
    generated from a step) has no ``round``."""
    low = jnp.floor(x)
    frac = x - low
    odd = low - 2 * jnp.floor(low / 2)
    return jnp.where(frac > 0.5, low + 1, jnp.where(frac < 0.5, low, low + odd))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _spike_count(x: jax.Array, surrogate: MultiLevelSpikeCount) -> jax.Array:
    return _round_half_even(jnp.clip(x, 0, surrogate.max_spike_count))


@_spike_count.defjvp
def _spike_count_jvp(surrogate, primals, tangents):
    (x,), (dx,) = primals, tangents
    return _spike_count(x, surrogate), surrogate.grad(x) * dx


@dataclasses.dataclass(frozen=True)
class MultiLevelSpikeCount(_Base):
    """Spike counts: forward ``round(clamp(x, 0, max_spike_count))`` (half to even), derivative 1 on
    ``grad_window`` (inclusive; default ``(0, max_spike_count)``), 0 outside; ``spiking=False``: the clamp."""

    max_spike_count: int
    spiking: bool = True
    grad_window: tuple[float, float] | None = None

    def check(self):
        m = self.max_spike_count
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"MultiLevelSpikeCount needs an integer max_spike_count >= 1, got {m!r}")
        lo, hi = (0.0, float(m)) if self.grad_window is None else (float(v) for v in self.grad_window)
        if lo > hi:
            raise ValueError(f"MultiLevelSpikeCount's grad_window must satisfy grad_min <= grad_max, got {(lo, hi)}")
        object.__setattr__(self, "grad_window", (lo, hi))

    @property
    def heaviside(self) -> bool:
        return False

    def __call__(self, x):
        return _spike_count(x, self) if self.spiking else self.primitive(x)

    def grad(self, x):
        lo, hi = self.grad_window
        return ((x >= lo) & (x <= hi)).astype(x.dtype)

    def primitive(self, x):
        return _clamp(x, 0, self.max_spike_count)


@dataclasses.dataclass(frozen=True)
class PoissonPass(_Base):
    """Random spikes ``bernoulli(x)`` (``x`` a probability) with the straight-through derivative 1;
    ``spiking=False``: the identity. Random, so the call takes a key: ``PoissonPass()(x, key)``."""

    spiking: bool = True

    @property
    def heaviside(self) -> bool:
        return False

    @property
    def needs_key(self) -> bool:
        return self.spiking

    def __call__(self, x, key: jax.Array | None = None):
        if not self.spiking:
            return x
        if key is None:
            raise ValueError("PoissonPass draws random spikes: pass a JAX key, PoissonPass()(x, key) (the neurons "
                             "have none to give, so they refuse this surrogate)")
        return _straight_through(x, jax.random.bernoulli(key, x).astype(x.dtype))

    def grad(self, x):
        return jnp.ones_like(x)

    def primitive(self, x):
        return x


@jax.custom_jvp
def _straight_through(x: jax.Array, values: jax.Array) -> jax.Array:
    """``values``, with the derivative of the identity in ``x``."""
    return values


@_straight_through.defjvp
def _straight_through_jvp(primals, tangents):
    return primals[1], tangents[0]


@dataclasses.dataclass(frozen=True)
class Rect(_Base):
    """``sg(x) = clip(alpha x + 1/2, 0, 1)``; ``sg'(x) = alpha`` for ``|x| < 1/(2 alpha)`` (strictly), else 0."""

    alpha: float = 1.0
    spiking: bool = True

    def grad(self, x):
        return jnp.where(jnp.abs(x) < 0.5 / self.alpha, self.alpha, 0.0).astype(x.dtype)

    def primitive(self, x):
        return _clamp(self.alpha * x + 0.5, 0.0, 1.0)


SURROGATES: dict[str, type] = {
    "sigmoid": Sigmoid, "atan": ATan, "piecewise_quadratic": PiecewiseQuadratic, "soft_sign": SoftSign, "rect": Rect,
    "piecewise_exp": PiecewiseExp, "super_spike": SuperSpike, "nonzero_sign_log_abs": NonzeroSignLogAbs, "erf": Erf,
    "piecewise_leaky_relu": PiecewiseLeakyReLU, "squarewave_fourier_series": SquarewaveFourierSeries, "s2nn": S2NN,
    "q_pseudo_spike": QPseudoSpike, "leaky_k_relu": LeakyKReLU, "fake_numerical_gradient": FakeNumericalGradient,
    "log_tailed_relu": LogTailedReLU, "deterministic_pass": DeterministicPass,
    "multi_level_spike_count": MultiLevelSpikeCount, "poisson_pass": PoissonPass,
}


def name_of(surrogate: Surrogate) -> str:
    """The registry name of a surrogate instance (``ATan()`` -> ``"atan"``)."""
    for name, cls in SURROGATES.items():
        if type(surrogate) is cls:
            return name
    raise ValueError(f"{surrogate!r} is not one of the named surrogates {sorted(SURROGATES)}")


def params_of(surrogate: Surrogate) -> dict:
    """The keywords that rebuild ``surrogate`` with ``get(name_of(surrogate), **params)`` (``spiking`` included)."""
    return {f.name: getattr(surrogate, f.name) for f in dataclasses.fields(surrogate)}


def get(name: str, alpha: float | None = None, **params) -> Surrogate:
    """A surrogate by registry name, ``alpha`` and any other keyword of its class.

    ``get("atan", 3.0)`` is ``ATan(alpha=3.0)``; ``get("piecewise_leaky_relu", w=0.5)``; names:
    ``SURROGATES`` (SpikingJelly's class names in snake case: ``sigmoid``, ``atan``, ``erf``, ``s2nn``, ...).
    """
    if name not in SURROGATES:
        raise ValueError(f"unknown surrogate {name!r}; choose one of {sorted(SURROGATES)}")
    cls = SURROGATES[name]
    keywords = {f.name for f in dataclasses.fields(cls)}
    if alpha is not None:
        params = {"alpha": alpha, **params}
    unknown = sorted(set(params) - keywords)
    if unknown:
        raise ValueError(f"surrogate {name!r} ({cls.__name__}) takes no {unknown}; its keywords are {sorted(keywords)}")
    required = sorted(f.name for f in dataclasses.fields(cls)
                      if f.default is dataclasses.MISSING and f.name not in params)
    if required:
        raise ValueError(f"surrogate {name!r} ({cls.__name__}) needs {required}: get({name!r}, {required[0]}=...)")
    return cls(**params)
