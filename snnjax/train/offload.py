"""Host offload (FSDP's ``cpu_offload``): the optimizer state and / or the parameters kept in ``pinned_host``
memory between steps.

``offload="opt_state"``: the step takes and returns the optimizer state in host memory; inside it the
state is moved to the device for the update and back (``jax.device_put`` to a memory kind, which XLA
turns into transfers). ``offload="params"`` keeps the parameters in host memory and each model unit
fetches its own when it runs (a plan's part: ``Plan.with_offload``, ``snnjax.parallel.param_stream``);
``offload="all"`` does both. The values are the same as without offload. Backends without a ``pinned_host``
memory kind (``host_memory_kind()`` is None) run the step as it is, with a note. On the CPU backend the
memory kinds exist (``device``, ``pinned_host``) but are the same RAM: the path runs and is tested there,
only a GPU shows the saving.
"""
from __future__ import annotations

from typing import Any

import jax
from jax.sharding import SingleDeviceSharding

from snnjax.parallel.param_stream import HOST_KIND, PARAM_OFFLOADS

OFFLOADS = ("none", "opt_state", "params", "all")  # what may live in host memory between steps
OPT_STATE_OFFLOADS = ("opt_state", "all")


def host_memory_kind(device: jax.Device | None = None) -> str | None:
    """``"pinned_host"`` where ``device`` (default: the first) offers it, else None."""
    device = device or jax.devices()[0]
    try:
        kinds = {m.kind for m in device.addressable_memories()}
    except Exception:  # noqa: BLE001 - backends without memory kinds
        return None
    return HOST_KIND if HOST_KIND in kinds else None


def check(offload: str) -> None:
    if offload not in OFFLOADS:
        raise ValueError(f"offload must be one of {OFFLOADS}, got {offload!r}")


def require_host_memory(offload: str) -> None:
    """ValueError if ``offload`` keeps the parameters in host memory and the backend has none: a step that
    streams parameters cannot run as it is, so it is refused rather than run without offload."""
    if offload in PARAM_OFFLOADS and host_memory_kind() is None:
        raise ValueError(f"offload={offload!r} needs a pinned_host memory kind, which the {jax.default_backend()} "
                         "backend does not offer; use offload='none'")


def state_shardings(state: Any, offload: str, device: jax.Device | None = None):
    """Single-device shardings of a ``TrainState`` with its optimizer state in host memory (None: no offload).
    Offloading the parameters needs a plan (``snnjax.train.apply_plan``), whose step streams them."""
    check(offload)
    if offload in PARAM_OFFLOADS:
        raise ValueError(f"offload={offload!r} keeps the parameters in host memory, which a plan's step streams to "
                         "the device unit by unit: use snnjax.train.apply_plan (e.g. with parallel.plan(model, "
                         "'data=1', mode='none'))")
    if offload == "none" or host_memory_kind(device) is None:
        return None
    on_device = SingleDeviceSharding(device or jax.devices()[0])
    return host_opt_state(jax.tree.map(lambda _: on_device, state), offload)


def host_opt_state(shardings: Any, offload: str) -> Any:
    """A ``TrainState`` of shardings (any kind: single-device, or a plan's ``NamedSharding``s) with the optimizer
    state's moved to host memory when ``offload`` says so and the backend has a host memory kind."""
    check(offload)
    kind = host_memory_kind()
    if offload not in OPT_STATE_OFFLOADS or kind is None:
        return shardings
    return shardings.replace(opt_state=jax.tree.map(lambda s: s.with_memory_kind(kind), shardings.opt_state))


def saves_device_memory(platform: str | None = None) -> bool:
    """Whether offloading frees device memory on ``platform`` (default: JAX's backend): a host memory kind that is
    not the device's own memory. On the CPU backend ``pinned_host`` is the same RAM, and XLA counts it as such."""
    return (platform or jax.default_backend()) != "cpu" and host_memory_kind() is not None


def to_memory(tree: Any, kind: str) -> Any:
    """``tree``'s arrays moved to memory kind ``kind`` (inside a jitted step: a transfer XLA schedules)."""
    return jax.tree.map(lambda x: jax.device_put(x, jax.memory.Space.Device if kind == "device" else
                                                 jax.memory.Space.Host), tree)


def wrap_step(step_fn, offload: str):
    """``step_fn(state, batch)`` taking and returning the optimizer state in host memory (``offload``)."""
    check(offload)
    if offload not in OPT_STATE_OFFLOADS or host_memory_kind() is None:
        return step_fn

    def step(state, batch):
        state = state.replace(opt_state=to_memory(state.opt_state, "device"))
        new_state, metrics = step_fn(state, batch)
        return new_state.replace(opt_state=to_memory(new_state.opt_state, "host")), metrics

    return step
