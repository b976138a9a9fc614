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

A neuron given by its single step (``base.StepNeuron``) runs the kernels generated from its step the same way
(``run``): each state variable is an operand (and its final value a result) of its own, sharded as the neurons
are, each scalar parameter a replicated operand whose gradient is summed over the shards like PLIF's ``dw``.

Shapes: ``x_seq [T, ...]``; ``v0`` a scalar (the shared fresh start) or ``[...]`` (a tuple of them for a
``StepNeuron``); per device the kernel sees ``[T, m]`` with ``m`` the local neurons. A trailing dim whose size
does not divide by its shard count is kept whole (padding would enter the parameters' gradients), as is every
dim when the operand's sharding is not a ``NamedSharding`` (no mesh to name the axes).
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

    IF / LIF / PLIF: ``forward(cfg, return_v_seq, x, v0, w) -> ((s, v), saved)``, ``saved`` a tuple of ``[..., m]``
    residuals; ``backward(cfg, return_v_seq, x, saved, v0, w, ds, dv) -> (dx, dv0, dw)`` (``ds`` / ``dv`` None where
    zero). A ``StepNeuron``: ``v0`` a tuple of its state variables (each ``[m]`` or a scalar), ``w`` a tuple of its
    scalar parameters, three outputs ``(out, V's sequence or None, final states tuple)`` and their three
    cotangents; ``dv0`` / ``dw`` tuples. ``compute_dtype(dtype)``: the dtype ``x`` is cast to before the kernel
    sees it.
    """

    name: str
    forward: Callable
    backward: Callable
    compute_dtype: Callable = lambda dtype: dtype


def multistep(kernel: Kernel, cfg: B.NeuronConfig | B.StepNeuron, x_seq: jax.Array, v_init=None, w=None, *,
              return_v_seq: bool = False):
    """``(spikes [T, ...], v)`` as ``snnjax.neurons.multistep``, through ``kernel`` run per shard (for a
    ``StepNeuron``, ``v`` as ``scan.multistep`` returns it).

    The caller (``snnjax.neurons.kernels.dispatch``) has checked that the kernel can run this call.
    """
    x_seq = jnp.asarray(x_seq)
    if isinstance(cfg, B.StepNeuron):
        state0 = None if v_init is None else B.start_states(cfg, x_seq, v_init)
        out, v_seq, last = run(kernel, cfg, x_seq, state0, w, return_v_seq=return_v_seq, split=True)
        return out, (v_seq if return_v_seq else last["v"] if len(cfg.fresh) == 1 else last)
    B.check_decay_param(cfg, w)
    sdt = B.state_dtype(x_seq.dtype)
    v0 = jnp.full((), cfg.vr, sdt) if v_init is None else B.broadcast_state(cfg, x_seq, v_init)
    w0 = jnp.asarray(w).reshape(()) if cfg.kind == "PLIF" else None
    s, v = _multistep(kernel, cfg, return_v_seq, True, x_seq.astype(kernel.compute_dtype(x_seq.dtype)), v0, w0)
    return s.astype(x_seq.dtype), v


def run(kernel: Kernel, neuron: B.StepNeuron, x_seq: jax.Array, state0: dict | None, params, *,
        return_v_seq: bool, split: bool):
    """A ``StepNeuron`` through ``kernel``: ``(outs [T, ...] in x's dtype, V [T, ...] or None, final state dict)``,
    as ``scan.run`` returns them, from ``state0`` (``{name: [...]}``; None: the fresh state, one value per state
    variable for every neuron, whose cotangent is not computed). Differentiable in ``x_seq``, ``state0`` and
    ``params`` (a pytree of scalars).

    ``split``: the SPMD partitioner splits the trailing dims (the kernel runs per shard, the parameters' gradients
    summed over the shards); else the kernel runs on the whole (local) array.
    """
    x_seq = jnp.asarray(x_seq)
    sdt = B.state_dtype(x_seq.dtype)
    if state0 is None:
        v0 = tuple(jnp.asarray(fresh, sdt) for _, fresh in neuron.fresh)
    else:
        v0 = tuple(jnp.asarray(state0[name], sdt) for name in neuron.names)
    w0 = tuple(jnp.asarray(a).reshape(()) for a in jax.tree.leaves(params))
    x = x_seq.astype(kernel.compute_dtype(x_seq.dtype))
    out, v_seq, last = _multistep(kernel, neuron, return_v_seq, split, x, v0, w0)
    return out.astype(x_seq.dtype), v_seq, dict(zip(neuron.names, last, strict=True))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _multistep(kernel, cfg, return_v_seq, split, x, v0, w):
    outs, _ = (_forward_op if split else _forward_block)(kernel, cfg, return_v_seq, x, v0, w)
    return outs


def _is_primal(p):
    return isinstance(p, CustomVJPPrimal)


def _multistep_fwd(kernel, cfg, return_v_seq, split, x, v0, w):
    x, v0, w = jax.tree.map(lambda p: p.value if _is_primal(p) else p, (x, v0, w), is_leaf=_is_primal)
    outs, saved = (_forward_op if split else _forward_block)(kernel, cfg, return_v_seq, x, v0, w)
    return outs, (x, saved, v0, w)


def _multistep_bwd(kernel, cfg, return_v_seq, split, res, cts):
    x, saved, v0, w = res
    cts = jax.tree.map(lambda c: None if isinstance(c, SymbolicZero) else c, cts,
                       is_leaf=lambda c: isinstance(c, SymbolicZero))
    if split:
        slots = _dw_slots(cfg)
        dx, dv0, dw = _backward_op(kernel, cfg, return_v_seq, slots, x, saved, v0, w, *cts)
        if slots:
            dw = jax.tree.map(jnp.sum, dw)
    else:
        dx, dv0, dw = _backward_block(kernel, cfg, return_v_seq, 0, x, saved, v0, w, *cts)
    return dx, dv0, jax.tree.map(lambda g, a: g.astype(a.dtype), dw, w)


def _n_params(cfg: B.NeuronConfig | B.StepNeuron) -> int:
    """The scalar parameters whose gradient is a sum over all neurons: PLIF's ``w``, a ``StepNeuron``'s leaves."""
    if isinstance(cfg, B.StepNeuron):
        return len(jax.tree.leaves(cfg.params_like))
    return int(cfg.kind == "PLIF")


def _dw_slots(cfg: B.NeuronConfig | B.StepNeuron) -> int:
    """0, or (a neuron with parameters inside a ``shard_map`` that leaves mesh axes automatic) the devices of
    those axes.

    There a ``psum`` inside the partitioned backward would name only the automatic axes' devices (XLA refuses
    the replica groups), so each device instead writes its block's share of each parameter's gradient into a slot
    of its own (``[slots]``) and the sum over the slots is left to the partitioner.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if not _n_params(cfg) or mesh.empty or not mesh.manual_axes:
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
    """``(outputs, saved)`` of the kernel's forward on this block (``v0`` / ``w`` / the outputs: pytrees)."""
    n = x.ndim
    outs, saved = kernel.forward(cfg, return_v_seq, _flat(x, n), jax.tree.map(lambda a: _flat(a, n), v0), w)
    unflat = functools.partial(_unflat, x_shape=x.shape)
    return jax.tree.map(unflat, outs), tuple(unflat(a) for a in saved)


def _backward_global(kernel, cfg, return_v_seq, slots, x, saved, v0, w, *cts):
    """The unpartitioned backward (``custom_partitioning`` takes no keyword-only arguments such as ``dw_axes``);
    with ``slots``, each parameter's gradient is ``[slots]`` holding the whole sum in slot 0."""
    dx, dv0, dw = _backward_block(kernel, cfg, return_v_seq, 0, x, saved, v0, w, *cts)
    if slots:
        dw = jax.tree.map(lambda g: jnp.zeros((slots,), g.dtype).at[0].set(g), dw)
    return dx, dv0, dw


def _backward_block(kernel, cfg, return_v_seq, slots, x, saved, v0, w, *cts, dw_axes=(), dw_copies=1):
    """``(dx, dv0, dw)`` on this block; ``cts``: the outputs' cotangents (None where zero)."""
    n = x.ndim
    flat = functools.partial(jax.tree.map, lambda a: _flat(a, n))
    dx, dv0, dw = kernel.backward(cfg, return_v_seq, _flat(x, n), tuple(_flat(a, n) for a in saved), flat(v0), w,
                                  *flat(cts))
    if slots:
        # This device's slot: its block's share, divided among the devices holding the same block (exact for
        # power-of-two copy counts: the slots then sum to the block sums bit for bit).
        dw = jax.tree.map(lambda g: (g / dw_copies).reshape(1), dw)
    elif dw_axes:
        dw = jax.tree.map(lambda g: jax.lax.psum(g, dw_axes), dw)  # this block's share of the sum over all neurons
    # A scalar start state is the shared constant fresh one: its cotangent is not wanted (zero).
    dv0 = jax.tree.map(lambda g, a: jnp.zeros_like(a) if a.ndim == 0 else _unflat(g, x.shape), dv0, v0)
    return _unflat(dx, x.shape), dv0, dw


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
        if slots and jax.tree.leaves(result_shape[2]):
            if mesh.size != slots:
                raise NotImplementedError(f"the parameters' gradients over {slots} devices, but the partitioner "
                                          f"tiles the neuron over a mesh of {mesh.size}")
            options["dw_copies"] = math.prod(mesh.shape[a] for a in mesh.axis_names if a not in used)
            slot = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names)))
            results = (results[0], results[1], jax.tree.map(lambda _: slot, result_shape[2]))
    lower = functools.partial(block, *static, **options)
    return mesh, lower, results, jax.tree.map(shard, arg_shapes)


def _forward_rule(kernel, cfg, return_v_seq, mesh, value_types, result_types):
    """Shardy's rule of the forward: see ``_rank_rule``."""
    return _rank_rule(value_types, result_types)


def _backward_rule(kernel, cfg, return_v_seq, slots, mesh, value_types, result_types):
    """Shardy's rule of the backward: ``_rank_rule``, and with ``slots`` the parameters' gradient slots (its last
    results) get a factor of their own."""
    slotted = _n_params(cfg) if slots else 0
    if not slotted:
        return _rank_rule(value_types, result_types)
    rule = _rank_rule(value_types, result_types[:-slotted])
    return SdyShardingRule(rule.operand_mappings, (*rule.result_mappings, *[ArrayMapping("slot")] * slotted),
                           need_replication_factors=rule.need_replication_factors)


def _rank_rule(value_types, result_types):
    """Rank-0 values replicated, the trailing dims pass through, a leading dim of a full-rank value (T, or a
    checkpoint count) needs replication."""
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
_forward_op.def_partition(functools.partial(_partition, _forward_block, False), sharding_rule=_forward_rule)
_backward_op = custom_partitioning(_backward_global, static_argnums=(0, 1, 2, 3))
_backward_op.def_partition(functools.partial(_partition, _backward_block, True), sharding_rule=_backward_rule)
