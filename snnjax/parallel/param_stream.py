"""Parameters kept in host memory and brought to the device one model unit at a time (``offload=params|all``).

A step traced inside ``streaming(placement_of)`` receives its parameters in host memory (``pinned_host``).
Each model unit (``snnjax.models.remat.unit``) then ``fetch``es the parameters it owns when it runs: one
``jax.device_put`` per parameter, to its compute layout in device memory (FSDP: the transfer of the
device's shard and the all-gather; the partitioning is the plan's, only the memory kind changes). The
unit runs under ``jax.checkpoint`` with ``host_policy``: nothing computed from a host-memory input is kept
for the backward, so the backward fetches the unit's parameters again instead of holding them from the
forward. The gradient of a fetch is the cotangent in the parameter's gradient layout (FSDP / ZeRO-2:
reduce-scattered on the device) written back to host memory.

Values are unchanged: a transfer copies, and recomputing a fetch gives the same array.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import re
from collections.abc import Callable, Iterator

import jax
from jax.sharding import NamedSharding

PARAM_OFFLOADS = ("params", "all")  # offload settings that keep the parameters in host memory
HOST_KIND = "pinned_host"


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a fetched parameter goes: ``compute`` (its layout while a unit uses it) and ``grad`` (the layout its
    gradient is written back to host memory in); None: no layout (one device), the memory space alone."""

    compute: NamedSharding | None = None
    grad: NamedSharding | None = None

    def on_host(self):
        return self.grad.with_memory_kind(HOST_KIND) if self.grad is not None else jax.memory.Space.Host


_ACTIVE: contextvars.ContextVar[Callable[[str], Placement] | None] = contextvars.ContextVar("param_stream",
                                                                                             default=None)


@contextlib.contextmanager
def streaming(placement_of: Callable[[str], Placement]) -> Iterator[None]:
    """While a step is traced: parameters arrive in host memory, and units fetch theirs (``placement_of``: a
    parameter's dotted path in the model -> its ``Placement``)."""
    token = _ACTIVE.set(placement_of)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> Callable[[str], Placement] | None:
    """The ``placement_of`` of the ``streaming`` context being traced, or None (parameters on the device)."""
    return _ACTIVE.get()


def scope(unit: str) -> str:
    """The name scope of a unit's fetches (in the step's jaxpr and HLO op names: ``param_fetch[features.3]``)."""
    return f"param_fetch[{unit}]"


def on_host(x) -> bool:
    """Whether array (or tracer) ``x`` lives in host memory."""
    return getattr(jax.typeof(x), "memory_space", None) == jax.memory.Space.Host


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def fetch(x: jax.Array, placement: Placement) -> jax.Array:
    """``x`` (host memory) copied to the device, then put in ``placement.compute`` there (FSDP: the shard is
    transferred, then all-gathered on the device); its gradient goes back to host memory."""
    x = jax.device_put(x, jax.memory.Space.Device)
    return x if placement.compute is None else jax.lax.with_sharding_constraint(x, placement.compute)


def _fetch_fwd(x, placement):
    return fetch(x, placement), None


def _fetch_bwd(placement, _, ct):
    if placement.grad is not None:  # reduce-scatter (FSDP, ZeRO-2) on the device, before the transfer
        ct = jax.lax.with_sharding_constraint(ct, placement.grad)
    return (jax.device_put(ct, placement.on_host()),)


fetch.defvjp(_fetch_fwd, _fetch_bwd)


def host_policy(base: Callable) -> Callable:
    """A ``jax.checkpoint`` policy: ``base``'s, except that nothing read from host memory (a ``fetch``) is kept
    for the backward, which fetches again."""

    def policy(prim, *avals, **params) -> bool:
        if any(getattr(a, "memory_space", None) == jax.memory.Space.Host for a in avals):
            return False
        return base(prim, *avals, **params)

    return policy


def transfers(stablehlo: str) -> dict[tuple[str, str, str], int]:
    """Host <-> device transfers of the units' parameters in a step's StableHLO text (``Lowered.as_text(
    debug_info=True)``), counted per ``(unit, "forward" | "backward", "to_device" | "to_host")``.

    Only a backend whose memory kinds are separate memories lowers a transfer (``annotate_device_placement``):
    jax lowers ``device_put`` inside a jitted function to nothing on the CPU, so lower for the GPU
    (``jitted.trace(...).lower(lowering_platforms=("cuda",))``) to see what a GPU compiles.
    """
    locations = dict(re.findall(r"^(#loc\d+) = loc\((.*)\)$", stablehlo, re.M))
    counts: dict[tuple[str, str, str], int] = {}
    for line in stablehlo.splitlines():
        if "annotate_device_placement" not in line:
            continue
        loc = re.search(r"loc\((#loc\d+)\)\s*$", line)
        name = locations.get(loc.group(1), "") if loc else ""
        unit = re.search(r"param_fetch\[([^\]]+)\]", name)
        if unit is None:
            continue
        phase = "backward" if ("transpose(" in name or "rematted_computation" in name) else "forward"
        kind = "to_device" if '_xla_buffer_placement = "device"' in line else "to_host"
        key = (unit.group(1), phase, kind)
        counts[key] = counts.get(key, 0) + 1
    return counts
