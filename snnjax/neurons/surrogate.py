"""Surrogate gradients: Heaviside forward, smooth derivative backward.

Each surrogate is a frozen (hashable) dataclass so it can be a static argument
of jitted and custom-differentiated functions. ``grad(x)`` is the surrogate
derivative ``sg'(x)`` used in place of the Dirac delta; ``primitive(x)`` is the
smooth function it is the derivative of. Formulas and defaults follow
SpikingJelly's ``activation_based.surrogate``.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Protocol

import jax
import jax.numpy as jnp

__all__ = ["ATan", "PiecewiseQuadratic", "Rect", "Sigmoid", "SoftSign", "Surrogate", "get", "name_of", "spike"]


class Surrogate(Protocol):
    """What a neuron needs of a surrogate function."""

    def grad(self, x: jax.Array) -> jax.Array: ...

    def primitive(self, x: jax.Array) -> jax.Array: ...


@dataclasses.dataclass(frozen=True)
class Sigmoid:
    """``sg(x) = sigmoid(alpha x)``; ``sg'(x) = alpha sigmoid(alpha x) (1 - sigmoid(alpha x))``."""

    alpha: float = 4.0

    def grad(self, x):
        s = jax.nn.sigmoid(self.alpha * x)
        return (1.0 - s) * s * self.alpha

    def primitive(self, x):
        return jax.nn.sigmoid(self.alpha * x)


@dataclasses.dataclass(frozen=True)
class ATan:
    """``sg(x) = atan(pi/2 alpha x) / pi + 1/2``; ``sg'(x) = (alpha/2) / (1 + (pi/2 alpha x)^2)``."""

    alpha: float = 2.0

    def grad(self, x):
        return self.alpha / 2.0 / (1.0 + jnp.square(math.pi / 2.0 * self.alpha * x))

    def primitive(self, x):
        return jnp.arctan(math.pi / 2.0 * self.alpha * x) / math.pi + 0.5


@dataclasses.dataclass(frozen=True)
class PiecewiseQuadratic:
    """``sg'(x) = alpha - alpha^2 |x|`` for ``|x| <= 1/alpha``, else 0."""

    alpha: float = 1.0

    def grad(self, x):
        ax = jnp.abs(x)
        return jnp.where(ax > 1.0 / self.alpha, 0.0, self.alpha - self.alpha**2 * ax).astype(x.dtype)

    def primitive(self, x):
        a = self.alpha
        inner = jnp.where(x < 0, 0.5 * a**2 * x**2 + a * x + 0.5, -0.5 * a**2 * x**2 + a * x + 0.5)
        return jnp.where(x < -1.0 / a, 0.0, jnp.where(x > 1.0 / a, 1.0, inner)).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class SoftSign:
    """``sg(x) = (alpha x / (1 + |alpha x|) + 1) / 2``; ``sg'(x) = 1 / (2 alpha (1/alpha + |x|)^2)``."""

    alpha: float = 2.0

    def grad(self, x):
        return 1.0 / (2.0 * self.alpha * jnp.square(1.0 / self.alpha + jnp.abs(x)))

    def primitive(self, x):
        ax = self.alpha * x
        return (ax / (1.0 + jnp.abs(ax)) + 1.0) / 2.0


@dataclasses.dataclass(frozen=True)
class Rect:
    """``sg(x) = clip(alpha x + 1/2, 0, 1)``; ``sg'(x) = alpha`` for ``|x| < 1/(2 alpha)`` (strictly), else 0."""

    alpha: float = 1.0

    def grad(self, x):
        return jnp.where(jnp.abs(x) < 0.5 / self.alpha, self.alpha, 0.0).astype(x.dtype)

    def primitive(self, x):
        return jnp.clip(self.alpha * x + 0.5, 0.0, 1.0)


SURROGATES = {"sigmoid": Sigmoid, "atan": ATan, "piecewise_quadratic": PiecewiseQuadratic, "soft_sign": SoftSign,
              "rect": Rect}


def name_of(surrogate: Surrogate) -> str:
    """The registry name of a surrogate instance (``ATan()`` -> ``"atan"``)."""
    for name, cls in SURROGATES.items():
        if type(surrogate) is cls:
            return name
    raise ValueError(f"{surrogate!r} is not one of the named surrogates {sorted(SURROGATES)}")


def get(name: str, alpha: float | None = None) -> Surrogate:
    """A surrogate by name (``sigmoid``, ``atan``, ``piecewise_quadratic``, ``soft_sign``, ``rect``)."""
    if name not in SURROGATES:
        raise ValueError(f"unknown surrogate {name!r}; choose one of {sorted(SURROGATES)}")
    cls = SURROGATES[name]
    return cls() if alpha is None else cls(alpha=alpha)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def spike(x: jax.Array, surrogate: Surrogate) -> jax.Array:
    """Heaviside step ``1[x >= 0]`` whose derivative is ``surrogate.grad(x)``."""
    return (x >= 0).astype(x.dtype)


@spike.defjvp
def _spike_jvp(surrogate, primals, tangents):
    (x,), (dx,) = primals, tangents
    return spike(x, surrogate), surrogate.grad(x) * dx
