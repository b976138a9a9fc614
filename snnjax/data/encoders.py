"""Encoders that turn static images ``[N, H, W, C]`` into time-major inputs ``[T, N, H, W, C]``.

Pure jax functions (jit-able, ``time_steps`` static).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

ENCODERS = ("direct", "poisson")


def direct_encode(images: jax.Array, time_steps: int) -> jax.Array:
    """Repeats ``images [N, ...]`` at every step: ``[T, N, ...]`` (the 'direct' input of SNNs)."""
    return jnp.broadcast_to(images[None], (time_steps, *images.shape))


def poisson_encode(key: jax.Array, images: jax.Array, time_steps: int) -> jax.Array:
    """Rate coding: independent Bernoulli spikes with probability ``clip(pixel, 0, 1)`` per step.

    Args:
      key: a jax PRNG key.
      images: ``[N, ...]`` intensities in ``[0, 1]`` (floating dtype).
      time_steps: ``T``.

    Returns:
      ``[T, N, ...]`` spikes (0 or 1) in ``images.dtype``.
    """
    p = jnp.clip(images, 0.0, 1.0)
    return jax.random.bernoulli(key, p, shape=(time_steps, *images.shape)).astype(images.dtype)


def encode(kind: str, images: jax.Array, time_steps: int, key: jax.Array | None = None) -> jax.Array:
    """Encodes ``images [N, ...]`` as ``[T, N, ...]`` with ``kind`` in :data:`ENCODERS`."""
    if kind == "direct":
        return direct_encode(images, time_steps)
    if kind == "poisson":
        if key is None:
            raise ValueError("poisson encoding needs a PRNG key")
        return poisson_encode(key, images, time_steps)
    raise ValueError(f"unknown encoder {kind!r}; choose one of {ENCODERS}")
