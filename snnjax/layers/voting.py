"""SpikingJelly's ``layer.VotingLayer``: each class's output is the mean of a group of neurons."""
from __future__ import annotations

import jax


def vote(x: jax.Array, voting_size: int = 10) -> jax.Array:
    """``x [..., K * voting_size] -> [..., K]``: the mean of each consecutive group of ``voting_size`` outputs.

    SpikingJelly pools with a 1-D average of kernel and stride ``voting_size``; here the feature count must
    divide exactly (a remainder would be silently dropped there).
    """
    f = x.shape[-1]
    if f % voting_size:
        raise ValueError(f"voting over groups of {voting_size} needs a multiple of {voting_size} features, got {f}")
    return x.reshape(*x.shape[:-1], f // voting_size, voting_size).mean(-1)
