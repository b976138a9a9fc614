"""A model as a chain of units: the granularity of pipeline stages and activation checkpointing.

Every model defines ``units() -> list[Unit]``; its ``__call__`` is ``run_units(self.units(), x)``.
A unit is bound to its model: ``unit(x)`` runs it on the activations the previous unit produced
(the first unit takes the model's input ``[T, N, ...]``, the last returns the logits ``[T, N, K]``).
``owns`` lists the path prefixes of the parameters and state (BatchNorm statistics) the unit uses,
so a pipeline stage can hold exactly its units' variables (``snnjax.parallel.variables.owner``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax


@dataclasses.dataclass(frozen=True)
class Unit:
    """One link of a model's chain: ``name`` (e.g. ``"features.3"``), the variable path prefixes it ``owns``
    (e.g. ``("features.3",)``, dotted as ``snnjax.parallel.variables.path_str`` writes them), and ``fn``."""

    name: str
    owns: tuple[str, ...]
    fn: Callable[[jax.Array], jax.Array]

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fn(x)


def run_units(units: Sequence[Unit], x: jax.Array) -> jax.Array:
    """The units applied in order."""
    for unit in units:
        x = unit(x)
    return x
