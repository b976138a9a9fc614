"""Host offload of the optimizer state (FSDP's ``cpu_offload``): kept in ``pinned_host`` memory between steps.

``offload="opt_state"``: the step takes and returns the optimizer state in host memory; inside it the
state is moved to the device for the update and back (``jax.device_put`` to a memory kind, which XLA
turns into transfers). The values are the same as without offload. Backends without a ``pinned_host``
memory kind (``host_memory_kind()`` is None) run the step as it is, with a note. On the CPU backend the
memory kinds exist (``device``, ``pinned_host``) but are the same RAM: the path runs and is tested there,
only a GPU shows the saving.
"""
from __future__ import annotations

from typing import Any

import jax
from jax.sharding import SingleDeviceSharding

OFFLOADS = ("none", "opt_state")


def host_memory_kind(device: jax.Device | None = None) -> str | None:
    """``"pinned_host"`` where ``device`` (default: the first) offers it, else None."""
    device = device or jax.devices()[0]
    try:
        kinds = {m.kind for m in device.addressable_memories()}
    except Exception:  # noqa: BLE001 - backends without memory kinds
        return None
    return "pinned_host" if "pinned_host" in kinds else None


def check(offload: str) -> None:
    if offload not in OFFLOADS:
        raise ValueError(f"offload must be one of {OFFLOADS}, got {offload!r}")


def state_shardings(state: Any, offload: str, device: jax.Device | None = None):
    """Single-device shardings of a ``TrainState`` with its optimizer state in host memory (None: no offload)."""
    check(offload)
    kind = host_memory_kind(device)
    if offload == "none" or kind is None:
        return None
    device = device or jax.devices()[0]
    on_device, on_host = SingleDeviceSharding(device), SingleDeviceSharding(device, memory_kind=kind)
    shardings = jax.tree.map(lambda _: on_device, state)
    return shardings.replace(opt_state=jax.tree.map(lambda _: on_host, state.opt_state))


def to_memory(tree: Any, kind: str) -> Any:
    """``tree``'s arrays moved to memory kind ``kind`` (inside a jitted step: a transfer XLA schedules)."""
    return jax.tree.map(lambda x: jax.device_put(x, jax.memory.Space.Device if kind == "device" else
                                                 jax.memory.Space.Host), tree)


def wrap_step(step_fn, offload: str):
    """``step_fn(state, batch)`` taking and returning the optimizer state in host memory (``offload``)."""
    check(offload)
    if offload == "none" or host_memory_kind() is None:
        return step_fn

    def step(state, batch):
        state = state.replace(opt_state=to_memory(state.opt_state, "device"))
        new_state, metrics = step_fn(state, batch)
        return new_state.replace(opt_state=to_memory(new_state.opt_state, "host")), metrics

    return step
