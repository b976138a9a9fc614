"""The fused neuron kernels under a sharded layout: to the SPMD partitioner, one elementwise op over the trailing dims.

An opaque kernel call (an FFI custom call, a ``pallas_call``) is something the partitioner
cannot split: it gathers the operands onto every device and runs the whole call there. Here
the kernels' forward and backward are each a ``jax.experimental.custom_partitioning`` op
whose sharding rule (Shardy) says: the time dim ``T`` must stay whole (the recurrence needs
all of it), every trailing dim passes through. The partitioner keeps whatever sharding the
layout gave the trailing dims (batch over data / fsdp, channels over tensor, rows under
sequence parallelism, ...) and calls the kernel once per device on the local block,
flattened to ``[T, m]`` there (a global flatten to ``[T, M]`` would merge a sharded minor dim
and force a gather). PLIF's ``dw`` is the sum over all neurons: each device's partial is
``psum``-ed over the mesh axes that split the neurons.

Shapes: ``x_seq [T, ...]``; ``v0`` a scalar (the shared fresh start) or ``[...]``; per device
the kernel sees ``[T, m]`` with ``m`` the local neurons. A trailing dim whose size does not
divide by its shard count is kept whole (padding would enter PLIF's ``dw``), as is every dim
when the operand's sharding is not a ``NamedSharding`` (no mesh to name the axes).
On one device the custom-partitioning op lowers to the plain kernel call.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero
from jax.experimental.custom_partitioning import ArrayMapping, SdyShardingRule, custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from snnjax.neurons import base as B


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A fused kernel's rules on one block ``x [T, m]`` (the kernel packages' ``forward_rule`` / ``backward_rule``).

    ``forward(cfg, return_v_seq, x, v0, w) -> ((s, v), saved)``, ``saved`` a tuple of ``[..., m]`` residuals;
    ``backward(cfg, return_v_seq, x, saved, v0, w, ds, dv) -> (dx, dv0, dw)`` (``ds`` / ``dv`` None where zero);
    ``compute_dtype(dtype)``: the dtype ``x`` is cast to before the kernel sees it.
    """

    name: str
    forward: Callable
    backward: Callable
    compute_dtype: Callable = lambda dtype: dtype


def multistep(kernel: Kernel, cfg: B.NeuronConfig, x_seq: jax.Array, v_init=None, w=None, *,
              return_v_seq: bool = False):
    """``(spikes [T, ...], v)`` as ``snnjax.neurons.multistep``, through ``kernel`` run per shard.

    The caller (``snnjax.neurons.kernels.dispatch``) has checked that the kernel can run this call.
    """
    B.check_decay_param(cfg, w)
    x_seq = jnp.asarray(x_seq)
    sdt = B.state_dtype(x_seq.dtype)
    v0 = jnp.full((), cfg.vr, sdt) if v_init is None else B.broadcast_state(cfg, x_seq, v_init)
    w0 = jnp.asarray(w).reshape(()) if cfg.kind == "PLIF" else None
    s, v = _multistep(kernel, cfg, return_v_seq, x_seq.astype(kernel.compute_dtype(x_seq.dtype)), v0, w0)
    return s.astype(x_seq.dtype), v


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _multistep(kernel, cfg, return_v_seq, x, v0, w):
    s, v, _ = _forward_op(kernel, cfg, return_v_seq, x, v0, w)
    return s, v


def _multistep_fwd(kernel, cfg, return_v_seq, x, v0, w):
    x, v0, w = (p.value if isinstance(p, CustomVJPPrimal) else p for p in (x, v0, w))
    s, v, saved = _forward_op(kernel, cfg, return_v_seq, x, v0, w)
    return (s, v), (x, saved, v0, w)


def _multistep_bwd(kernel, cfg, return_v_seq, res, cts):
    x, saved, v0, w = res
    ds, dv = (None if isinstance(c, SymbolicZero) else c for c in cts)
    slots = _dw_slots(cfg)
    dx, dv0, dw = _backward_op(kernel, cfg, return_v_seq, slots, x, saved, v0, w, ds, dv)
    return dx, dv0, (dw.sum() if slots else dw)


def _dw_slots(cfg: B.NeuronConfig) -> int:
    """0, or (PLIF inside a ``shard_map`` that leaves mesh axes automatic) the devices of those axes.

    There a ``psum`` inside the partitioned backward would name only the automatic axes' devices (XLA refuses
    the replica groups), so each device instead writes its block's share of ``dw`` into a slot of its own
    (``[slots]``) and the sum over the slots is left to the partitioner.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if cfg.kind != "PLIF" or mesh.empty or not mesh.manual_axes:
        return 0
    return math.prod(mesh.shape[a] for a in mesh.axis_names if a not in mesh.manual_axes)


_multistep.defvjp(_multistep_fwd, _multistep_bwd, symbolic_zeros=True)


# --- the two partitioned ops; each body is written for any block of the trailing dims ----------------------


def _flat(a, ndim):
    """``[T, ...]`` / ``[...]`` / scalar -> ``[T, m]`` / ``[m]`` / scalar (``ndim``: rank of ``x``)."""
    if a is None or a.ndim == 0:
        return a
    return a.reshape(a.shape[0], -1) if a.ndim == ndim else a.reshape(-1)


def _unflat(a, x_shape):
    """Inverse of ``_flat`` for one block: ``[..., m]`` back to ``[..., *trailing]``; scalars stay."""
    return a if a.ndim == 0 else a.reshape(*a.shape[:-1], *x_shape[1:])


def _forward_block(kernel, cfg, return_v_seq, x, v0, w):
    (s, v), saved = kernel.forward(cfg, return_v_seq, _flat(x, x.ndim), _flat(v0, x.ndim), w)
    return _unflat(s, x.shape), _unflat(v, x.shape), tuple(_unflat(a, x.shape) for a in saved)


def _backward_global(kernel, cfg, return_v_seq, slots, x, saved, v0, w, ds, dv):
    """The unpartitioned backward (``custom_partitioning`` takes no keyword-only arguments such as ``dw_axes``);
    with ``slots``, ``dw`` is ``[slots]`` holding the whole sum in slot 0."""
    dx, dv0, dw = _backward_block(kernel, cfg, return_v_seq, 0, x, saved, v0, w, ds, dv)
    if slots and dw is not None:
        dw = jnp.zeros((slots,), dw.dtype).at[0].set(dw)
    return dx, dv0, dw


def _backward_block(kernel, cfg, return_v_seq, slots, x, saved, v0, w, ds, dv, *, dw_axes=(), dw_copies=1):
    n = x.ndim
    dx, dv0, dw = kernel.backward(cfg, return_v_seq, _flat(x, n), tuple(_flat(a, n) for a in saved),
                                  _flat(v0, n), w, _flat(ds, n), _flat(dv, n))
    if dw is not None and slots:
        # This device's slot: its block's share, divided among the devices holding the same block (exact for
        # power-of-two copy counts: the slots then sum to the block sums bit for bit).
        dw = (dw / dw_copies).reshape(1)
    elif dw is not None and dw_axes:
        dw = jax.lax.psum(dw, dw_axes)  # PLIF: this block's share of the sum over all neurons
    # A scalar v0 is the shared constant start: its cotangent is not wanted (zero, as the kernels return it).
    return _unflat(dx, x.shape), (jnp.zeros_like(v0) if v0.ndim == 0 else _unflat(dv0, x.shape)), dw


def _trailing_spec(mesh, x) -> tuple | None:
    """The mesh axes of each trailing dim of ``x`` as the partitioner proposes them (None: keep all whole)."""
    sharding = x.sharding
    if not isinstance(sharding, NamedSharding) or mesh.empty:
        return None
    spec = tuple(sharding.spec) + (None,) * (x.ndim - len(sharding.spec))
    out = []
    for size, axes in zip(x.shape[1:], spec[1:], strict=True):
        names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        shards = math.prod(mesh.shape[a] for a in names)
        out.append(axes if names and size % shards == 0 else None)
    return tuple(out)


def _tile_mesh(x):
    """``(mesh, trailing spec)`` read off an unnamed (``GSPMDSharding``) tiling of ``x``, or None.

    Inside a ``shard_map`` that is manual over some mesh axes, the partitioner hands over the automatic axes'
    tiling without names: one mesh axis is made per tiled trailing dim (and one per replicated group), over
    the same devices in the tiling's order, so the kernel still runs on each device's own block.
    """
    try:
        hlo = x.sharding._to_xla_hlo_sharding(x.ndim)
    except (AttributeError, TypeError, ValueError):
        return None
    if not hlo.is_tiled() or hlo.subgroup_types() and not hlo.replicate_on_last_tile_dim():
        return None
    dims = list(hlo.tile_assignment_dimensions())
    if dims[0] != 1 or any(size % t for size, t in zip(x.shape[1:], dims[1:x.ndim], strict=True)):
        return None  # T split, or a block that would need padding: keep every dim whole
    devices = np.asarray(x.sharding._device_assignment, dtype=object)
    grid = devices[np.asarray(hlo.tile_assignment_devices())].reshape(dims)
    names = tuple(f"dim{i}" for i in range(x.ndim)) + tuple(f"rep{j}" for j in range(len(dims) - x.ndim))
    keep = [i for i, t in enumerate(dims) if t > 1] or [len(dims) - 1]
    mesh = jax.sharding.Mesh(grid.reshape([dims[i] for i in keep]), tuple(names[i] for i in keep))
    return mesh, tuple(names[i] if dims[i] > 1 else None for i in range(1, x.ndim))


def _sharding_for(mesh, trailing, ndim, leaf):
    """A leaf of rank 0 is replicated, rank ``ndim - 1`` is ``trailing``, rank ``ndim`` adds a whole leading dim."""
    if leaf.ndim == 0:
        return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(mesh, PartitionSpec(*((None,) if leaf.ndim == ndim else ()), *trailing))


def _partition(block, reduces_dw, *args):
    """``custom_partitioning``'s ``partition``: every operand and result keeps x's trailing sharding, T whole."""
    *static, mesh, arg_shapes, result_shape = args
    x = arg_shapes[0]
    trailing = _trailing_spec(mesh, x)
    if trailing is None and (tiled := _tile_mesh(x)) is not None:
        mesh, trailing = tiled
    if trailing is None:  # no mesh axes to keep: the whole call on every device
        if mesh.empty:
            mesh = jax.sharding.Mesh(np.asarray(x.sharding._device_assignment), ("all",))
        trailing = (None,) * (x.ndim - 1)
    used = tuple(a for axes in trailing if axes is not None for a in ((axes,) if isinstance(axes, str) else axes))
    shard = functools.partial(_sharding_for, mesh, trailing, x.ndim)
    results = jax.tree.map(shard, result_shape)
    options = {}
    if reduces_dw:
        options["dw_axes"] = used
        slots = static[3]
        if slots and result_shape[2] is not None:
            if mesh.size != slots:
                raise NotImplementedError(f"PLIF's dw over {slots} devices, but the partitioner tiles the neuron "
                                          f"over a mesh of {mesh.size}")
            options["dw_copies"] = math.prod(mesh.shape[a] for a in mesh.axis_names if a not in used)
            results = (results[0], results[1], NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names))))
    lower = functools.partial(block, *static, **options)
    return mesh, lower, results, jax.tree.map(shard, arg_shapes)


def _rule(*args):
    """Shardy's rule: rank-0 values replicated, the trailing dims pass through, a leading dim of a full-rank value
    (T, or a checkpoint count) needs replication; PLIF's ``dw`` slots (the backward's last result when it has
    rank 1 and the op has slots) get a factor of their own."""
    *static, value_types, result_types = args
    slotted = len(static) > 3 and static[3] and len(result_types) == 3 and result_types[2].rank == 1
    if slotted:
        rule = _rule(*static[:3], 0, value_types, result_types[:2])
        return SdyShardingRule(rule.operand_mappings, (*rule.result_mappings, ArrayMapping("slot")),
                               need_replication_factors=rule.need_replication_factors)
    ranks = [t.rank for t in (*value_types, *result_types)]
    ndim = ranks[0]
    trailing = tuple(f"d{i}" for i in range(1, ndim))
    leading, mappings = [], []
    for i, rank in enumerate(ranks):
        if rank == 0:
            mappings.append(ArrayMapping())
        elif rank == ndim - 1:
            mappings.append(ArrayMapping(*trailing))
        elif rank == ndim:
            leading.append(f"t{i}")
            mappings.append(ArrayMapping(leading[-1], *trailing))
        else:
            raise ValueError(f"neuron operand of rank {rank} for inputs of rank {ndim}")
    n_in = len(value_types)
    return SdyShardingRule(tuple(mappings[:n_in]), tuple(mappings[n_in:]), need_replication_factors=tuple(leading))


_forward_op = custom_partitioning(_forward_block, static_argnums=(0, 1, 2))
_forward_op.def_partition(functools.partial(_partition, _forward_block, False), sharding_rule=_rule)
_backward_op = custom_partitioning(_backward_global, static_argnums=(0, 1, 2, 3))
_backward_op.def_partition(functools.partial(_partition, _backward_block, True), sharding_rule=_rule)
