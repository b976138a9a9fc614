"""The device mesh: named axes ``data``, ``fsdp``, ``tensor``, ``stage``, ``time`` (size 1 where unused).

``time`` splits the time steps of the activations (temporal parallelism, ``snnjax.neurons.kernels.temporal``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

AXES = ("data", "fsdp", "tensor", "stage", "time")
BATCH_AXES = ("data", "fsdp")  # the global batch is split over both


def parse_mesh_spec(spec: str) -> dict[str, int]:
    """``"data=2,tensor=-1"`` -> ``{"data": 2, "tensor": -1}`` (unnamed axes are 1)."""
    sizes: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in AXES:
            raise ValueError(f"mesh spec {spec!r}: {part!r} must be axis=size with axis in {list(AXES)}")
        if name in sizes:
            raise ValueError(f"mesh spec {spec!r} names axis {name!r} twice")
        try:
            sizes[name] = int(value)
        except ValueError:
            raise ValueError(f"mesh spec {spec!r}: size of {name!r} must be an integer, got {value!r}") from None
        if sizes[name] == 0 or sizes[name] < -1:
            raise ValueError(f"mesh spec {spec!r}: size of {name!r} must be positive or -1 (all remaining devices)")
    if sum(v == -1 for v in sizes.values()) > 1:
        raise ValueError(f"mesh spec {spec!r}: at most one axis may be -1")
    return sizes


def mesh_shape(spec: str, num_devices: int) -> dict[str, int]:
    """Axis sizes for ``num_devices``, filling a -1 axis; error if the product does not match."""
    sizes = parse_mesh_spec(spec)
    fixed = math.prod(v for v in sizes.values() if v != -1)
    if -1 in sizes.values():
        if num_devices % fixed:
            raise ValueError(f"mesh {spec!r}: the fixed axes use {fixed} devices, which does not divide the "
                             f"{num_devices} available; change the sizes so their product divides {num_devices}")
        sizes = {k: (num_devices // fixed if v == -1 else v) for k, v in sizes.items()}
    shape = {axis: sizes.get(axis, 1) for axis in AXES}
    need = math.prod(shape.values())
    if need != num_devices:
        raise ValueError(f"mesh {spec!r} needs {need} devices but {num_devices} are available; "
                         f"make the sizes multiply to {num_devices} or set one axis to -1. "
                         + _device_hint(need, num_devices))
    return shape


def _device_hint(need: int, have: int) -> str:
    """How to get ``need`` devices where ``have`` are given: fake CPU devices, or a sub-mesh."""
    if need < have:
        return (f"To use {need} of them, lay the mesh over a subset: devices=jax.devices()[:{need}] "
                "(snnjax.parallel.make_mesh(spec, devices=...), snnjax.trainer(..., devices=...)).")
    if jax.default_backend() == "cpu":
        return (f"On the CPU, {need} devices need XLA_FLAGS=--xla_force_host_platform_device_count={need} set before "
                "JAX starts: in a shell, export it before python; in a notebook, restart the kernel and set "
                f"os.environ['XLA_FLAGS'] in the first cell, before importing jax or snnjax (JAX has "
                f"{jax.device_count()} device(s) now and cannot add more).")
    return f"This process sees {jax.device_count()} {jax.default_backend()} device(s)."


def make_mesh(spec: str = "data=-1", devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``Mesh`` over ``devices`` (default: all) with the named axes ``AXES``, auto-sharded."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(spec, len(devices))
    return jax.make_mesh(tuple(shape.values()), AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)


def batch_size_per_shard(mesh: Mesh) -> int:
    """How many shards the batch axis is split into (``data * fsdp``)."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


def check_batch_divides(mesh: Mesh, global_batch_size: int, grad_accum_steps: int = 1) -> None:
    """Error unless every (micro)batch splits evenly over ``data x fsdp``."""
    shards = batch_size_per_shard(mesh)
    micro = global_batch_size // grad_accum_steps
    if micro % shards:
        raise ValueError(f"the (micro)batch of {micro} examples (global_batch_size={global_batch_size} / "
                         f"grad_accum_steps={grad_accum_steps}) does not divide over data x fsdp = {shards} "
                         f"devices; use a batch size that is a multiple of {shards * grad_accum_steps}")


def batch_sharding(mesh: Mesh, ndim: int, batch_axis: int = 0) -> NamedSharding:
    """Sharding of an array whose ``batch_axis`` is split over (data, fsdp), the rest replicated."""
    spec = [None] * ndim
    spec[batch_axis] = BATCH_AXES
    return NamedSharding(mesh, PartitionSpec(*spec))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated sharding on ``mesh``."""
    return NamedSharding(mesh, PartitionSpec())
