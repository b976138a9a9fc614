"""The time-sharded multi-step neuron: T split over the mesh axis ``time``, pipelined over blocks of neurons.

Under a layout whose mesh has a ``time`` axis of P > 1 devices, device k holds the time steps
``[k T/P, (k+1) T/P)`` of every activation. Everything but the neuron recurrence acts on each step
on its own; the recurrence needs, on device k, the membrane potential device k-1 ends its segment
with. The neurons are split into B blocks and pipelined (a ``jax.shard_map`` manual over ``time``,
the other mesh axes left to the partitioner): at tick i (``0 <= i < B + P - 1``) device k
integrates block ``i - k`` of its segment from the potential device k-1 sent at tick i-1 (device 0
from ``v_init``), then sends its block's final potential to device k+1 (``lax.ppermute``). A
device is idle in P-1 of the B+P-1 ticks: the bubble is ``(P-1) / (B+P-1)``.

The backward (``custom_vjp``) runs the same pipeline in reverse: device P-1 starts, device k
computes block ``i - (P-1-k)``'s gradients from the dL/dV device k+1 sent, and sends the dL/dV
of its segment's start potential on to device k-1. Each block's gradients recompute the block's
forward from its start potential, the one residual besides ``x`` (``[P, ...]``: one potential per
device and neuron). PLIF's ``dw`` is the sum over blocks, then over ``time``. On its idle ticks a
device computes block 0 before its first block (overwritten at that block's own tick) and, after
its last block, that block again from the same start (the same values once more), so no buffer
needs a select; what it sends on an idle tick is zeroed. Spikes and states equal the unsharded
neuron's bit for bit (the same operations in the same order on the same values); gradients equal
them to rounding (PLIF's ``dw`` is summed in another order).

A neuron given by its single step (``base.StepNeuron``: the catalogue's, a user's) runs the same pipeline with
its whole state (every state variable, a dict) passed between devices and its parameters' gradients summed like
PLIF's ``dw``; each block is its ``scan`` path (``kernels.scan``) or, given a ``kernel``, the kernel generated
from its step (``sharded.run``).

Per block runs the ``xla`` path (``kernels.xla``) or, given a ``kernel`` (``kernels.sharded.Kernel``:
the native CPU kernels, the Pallas kernels), that kernel's forward and backward on the block flattened to
``[T/P, m]``; where other mesh axes (data, fsdp, tensor) split the activations too, the kernel runs through
``snnjax.neurons.kernels.sharded`` on each device's share of the block. ``impl="auto"`` takes the kernel per
block only on the backends of ``KERNEL_BLOCK_BACKENDS``. On the 2-core CPU (``python -m snnjax.bench.temporal
--what layer --impls xla,native``, float32 LIF forward + backward on ``[T, 2, 48, 48, C]``, T = 64 and 256,
C = 64 and 128, P = 2, 4, 8) the ``xla`` path per block took 0.77-1.02x the native kernels' time (the
native kernels alone, T whole on one device: 0.56-0.69x the ``xla`` path's): each block is copied out of
the segment into the kernel's operand and back, and those copies cost more than the kernels save.

Blocks: the trailing dims are viewed as ``(first, product of the middle ones, last)`` (``[N, H*W, C]``,
``[N, L, D]``; a row-major merge that keeps the batch and channel shardings), and the neurons are split
along one dim of that view of size ``n``: as ``[B, n / B]`` (block index major: each block a contiguous
run of neurons per step) where no mesh axis but ``time`` splits the activations, else as ``[n / B, B]``
(block index minor), so that a dim the partitioner shards stays sharded as long as its shard count divides
``n / B``. The pipeline runs on that view without its dims of size 1. ``choose_blocks``
prefers the merged middle dim (pixels, tokens: contiguous runs of channels per neuron group, and no
strategy but sequence parallelism shards it), then the last, then the first. The automatic count (``blocks=0``) is
the smallest B dividing ``n`` with a bubble under ``BUBBLE_TARGET`` (B >= 9(P-1)+1 for 10%), while
every block keeps at least ``MIN_BLOCK_NEURONS`` neurons; where no such B exists, the largest B
that keeps blocks that large (the bubble is then larger, and ``layer_schedule`` says so).

Bytes sent per step, per device and layer: one block's potentials forward and their gradients
backward at each of the B+P-1 ticks, ``2 (m/B) s (B+P-1)`` bytes (``m`` neurons on the device,
``s`` bytes of the state dtype), about ``2 m s`` when the bubble is small.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax._src import mesh as jax_mesh  # get_concrete_mesh: the devices of ``jax.set_mesh``, readable under jit
from jax.sharding import PartitionSpec as P

from snnjax.neurons import base as B
from snnjax.neurons.kernels import scan, sharded, xla
from snnjax.recording import Recorder

TIME_AXIS = "time"
BUBBLE_TARGET = 0.10
MIN_BLOCK_NEURONS = 512
KERNEL_BLOCK_BACKENDS: tuple[str, ...] = ()  # none yet: see the module docstring

_BLOCKS: contextvars.ContextVar[int] = contextvars.ContextVar("snnjax_time_blocks", default=0)


@contextlib.contextmanager
def block_count(blocks: int):
    """Within this context time-sharded neurons use ``blocks`` blocks (0: the automatic count)."""
    if blocks < 0:
        raise ValueError(f"time blocks must be >= 0 (0: automatic), got {blocks}")
    token = _BLOCKS.set(int(blocks))
    try:
        yield
    finally:
        _BLOCKS.reset(token)


_RECORD = Recorder("snnjax_time_schedules")
_MESH: contextvars.ContextVar = contextvars.ContextVar("snnjax_time_mesh", default=None)


@contextlib.contextmanager
def devices(mesh: jax.sharding.Mesh):
    """Within this context the time pipeline's ``shard_map`` runs on ``mesh`` (the concrete mesh behind the abstract
    mesh context a layout enters while tracing): a fused kernel per block that the partitioner splits further
    (``custom_partitioning``) needs the devices, not only the axis names."""
    token = _MESH.set(mesh)
    try:
        yield
    finally:
        _MESH.reset(token)


def _concrete_mesh():
    """The devices behind the current abstract mesh context (``devices``, or ``jax.set_mesh``'s), or None."""
    context = jax.sharding.get_abstract_mesh()
    for mesh in (_MESH.get(), jax_mesh.get_concrete_mesh()):  # the latter: set by ``jax.set_mesh``
        if mesh is not None and not mesh.empty and mesh.axis_names == context.axis_names \
                and mesh.axis_sizes == context.axis_sizes:
            return mesh
    return None


def _shard_map_mesh():
    """The concrete mesh for the time pipeline's ``shard_map`` (None: the mesh context's)."""
    return None if jax.sharding.get_abstract_mesh().manual_axes else _concrete_mesh()


def recording():
    """Collect ``(input shape, Schedule)`` of every time-sharded neuron traced within this context."""
    return _RECORD.recording()


def bubble(shards: int, blocks: int) -> float:
    """Idle share of the pipeline: ``(P-1) / (B+P-1)``."""
    return (shards - 1) / (blocks + shards - 1)


def min_blocks(shards: int, target: float = BUBBLE_TARGET) -> int:
    """The fewest blocks whose bubble is under ``target`` (``9(P-1)+1`` for 10%)."""
    return math.floor((shards - 1) * (1.0 - target) / target) + 1


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How one neuron layer ``[T, *trailing]`` is pipelined over ``shards`` devices."""

    shards: int
    blocks: int
    dim: int  # the dim of ``block_view(trailing)`` that is split into blocks
    neurons: int  # trailing elements (all devices of the other axes together)
    state_bytes: int  # bytes of one potential
    block_impl: str = "xla"  # what computes each block: ``xla`` or a fused kernel's name

    @property
    def bubble(self) -> float:
        return bubble(self.shards, self.blocks)

    @property
    def ticks(self) -> int:
        return self.blocks + self.shards - 1

    @property
    def bytes_sent(self) -> int:
        """Bytes one device sends per step: a block's potential (forward) and its gradient (backward) each
        tick, idle ticks included (``neurons`` here: those one device holds of the other axes' shards)."""
        return 2 * (self.neurons // self.blocks) * self.state_bytes * self.ticks


def block_view(trailing: tuple[int, ...]) -> tuple[int, ...]:
    """The trailing dims as the pipeline blocks them: ``(first, product of the middle ones, last)`` from rank 3 on
    (a row-major merge that keeps the first and last dims' shardings), else as they are."""
    if len(trailing) < 3:
        return tuple(trailing)
    return (trailing[0], math.prod(trailing[1:-1]), trailing[-1])


def _candidate_dims(view: tuple[int, ...]) -> list[int]:
    """Dims of the block view in order of preference: the merged middle one, then the last, then the first."""
    n = len(view)
    return ([1] if n == 3 else []) + ([n - 1] if n > 1 else []) + [0]


def choose_blocks(trailing: tuple[int, ...], shards: int, blocks: int = 0) -> tuple[int, int]:
    """``(dim, B)``: the dim of ``block_view(trailing)`` split into blocks and the block count (see the module
    docstring). ``blocks > 0`` asks for that count: the first preferred dim it divides; ValueError if none.
    """
    trailing = block_view(tuple(trailing))
    dims = _candidate_dims(trailing)
    if blocks > 0:
        for d in dims:
            if trailing[d] % blocks == 0:
                return d, blocks
        raise ValueError(f"parallel.time_blocks={blocks} (plan(time_blocks=...)) divides none of this neuron layer's "
                         f"dims {trailing}; choose a count that divides one of them (or 0 for the automatic count)")
    total = math.prod(trailing)
    want = min_blocks(shards)
    best, best_key = (dims[0], 1), None
    for rank, d in enumerate(dims):
        for b in range(1, trailing[d] + 1):
            if trailing[d] % b or (b > 1 and total // b < MIN_BLOCK_NEURONS):
                continue
            # Meeting the target beats missing it; then fewer blocks if met, more if missed; then the preferred dim.
            key = (b >= want, -b if b >= want else b, -rank)
            if best_key is None or key > best_key:
                best, best_key = (d, b), key
    return best


def layer_schedule(shape: tuple[int, ...], shards: int, dtype=jnp.float32, blocks: int = 0) -> Schedule:
    """The ``Schedule`` of a neuron layer on ``shape = [T, *trailing]`` (``dtype``: the input dtype); ``dim``
    indexes ``block_view(trailing)``."""
    trailing = tuple(shape[1:])
    try:
        d, b = choose_blocks(trailing, shards, blocks)
    except ValueError as e:
        raise ValueError(f"the neuron layer on input {tuple(shape)}: {e}") from None
    return Schedule(shards, b, d, math.prod(trailing), jnp.dtype(B.state_dtype(dtype)).itemsize)


def time_shards() -> int:
    """The size of the ``time`` axis of the current mesh context where this neuron would run (1: not sharded)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or TIME_AXIS not in mesh.axis_names or TIME_AXIS in mesh.manual_axes:
        return 1  # no time axis, or already inside a shard_map over it (each device sees its own segment)
    return int(mesh.shape[TIME_AXIS])


def applies(x_seq) -> bool:
    """Whether ``snnjax.neurons.kernels.dispatch`` runs ``x_seq`` through this pipeline (the mesh context shards time).

    Raises ValueError when time is sharded but ``T`` does not divide over it.
    """
    shards = time_shards()
    if shards < 2:
        return False
    t = jnp.shape(x_seq)[0]
    if t % shards:
        raise ValueError(f"the neuron input has T={t} time steps, which do not divide over the mesh axis "
                         f"time={shards}; use a T that is a multiple of {shards} or a smaller time axis")
    return True


def other_axes_split() -> bool:
    """Whether the current mesh context leaves an axis besides ``time`` of more than one device to the partitioner
    (axes an enclosing ``shard_map`` is manual over, such as a pipeline's ``stage``, split nothing here)."""
    mesh = jax.sharding.get_abstract_mesh()
    return any(n > 1 for a, n in mesh.shape.items() if a != TIME_AXIS and a not in mesh.manual_axes)


def multistep(cfg: B.NeuronConfig, x_seq: jax.Array, v_init=None, w=None, *, return_v_seq: bool = False,
              blocks: int | None = None, kernel: sharded.Kernel | None = None):
    """``(spikes [T, ...], v)`` as ``snnjax.neurons.multistep``, with T split over the mesh axis ``time``.

    ``blocks``: the block count (None: the ``block_count`` context's; 0: automatic). ``kernel``: the fused
    kernel that computes each block (the caller has checked that it can run this call); None: the ``xla``
    path. Needs a mesh context with a ``time``
    axis (``jax.sharding.use_abstract_mesh`` / ``jax.set_mesh``) that ``T`` divides by, and at least one
    trailing dim.
    """
    step_neuron = isinstance(cfg, B.StepNeuron)
    if not step_neuron:
        B.check_decay_param(cfg, w)
    x_seq = jnp.asarray(x_seq)
    shards = time_shards()
    if shards < 2 or x_seq.ndim < 2 or x_seq.shape[0] % shards:
        raise ValueError(f"the time-sharded neuron needs a mesh context with time > 1 dividing T and an input "
                         f"[T, ...] of rank >= 2; got time={shards}, shape {x_seq.shape}")
    if kernel is not None and other_axes_split() and not jax.sharding.get_abstract_mesh().manual_axes \
            and _concrete_mesh() is None:
        kernel = None  # only an abstract mesh: a kernel split further by the partitioner needs the devices
    sched = layer_schedule(x_seq.shape, shards, x_seq.dtype, _BLOCKS.get() if blocks is None else blocks)
    sched = dataclasses.replace(sched, block_impl="xla" if kernel is None else kernel.name)
    _RECORD.add((tuple(x_seq.shape), sched))
    v0 = B.start_states(cfg, x_seq, v_init) if step_neuron else B.broadcast_state(cfg, x_seq, v_init)
    w0 = w if step_neuron else jnp.asarray(w).reshape(()) if cfg.kind == "PLIF" else None
    # The pipeline views the trailing dims without those of size 1: with one kept, XLA:CPU laid the reshape into
    # the view out on its own and copied x and ds to undo it (two more segment-sized temporaries at N = 1).
    full = block_view(x_seq.shape[1:])
    kept = [i for i, n in enumerate(full) if n > 1 or i == sched.dim]
    view = tuple(full[i] for i in kept)
    blocks = _Blocks(sched.blocks, major=not other_axes_split())
    # The devices are looked up now: the backward is traced later, maybe outside the mesh contexts.
    static = (cfg, return_v_seq, v_init is not None, shards, kept.index(sched.dim), blocks, kernel, _shard_map_mesh())
    t, trailing = x_seq.shape[0], x_seq.shape[1:]
    s, v = _pipelined(static, x_seq.reshape(t, *view), jax.tree.map(lambda a: a.reshape(view), v0), w0)
    if return_v_seq:
        return s.reshape(x_seq.shape), v.reshape(v.shape[:1] + trailing)
    v = jax.tree.map(lambda a: a.reshape(trailing), v)
    return s.reshape(x_seq.shape), (v["v"] if step_neuron and len(cfg.fresh) == 1 else v)


# --- blocks: dim d of size n as [B, n / B] (block index major) or [n / B, B] (minor) --------------------------


@dataclasses.dataclass(frozen=True)
class _Blocks:
    """``count`` blocks of a dim of size n: ``[B, n / B]`` with ``major`` (each block a contiguous run of neurons per
    step), else ``[n / B, B]`` (a sharding of the dim stays on ``n / B``)."""

    count: int
    major: bool

    def split(self, a, axis):
        n, b = a.shape[axis], self.count
        return a.reshape(*a.shape[:axis], *((b, n // b) if self.major else (n // b, b)), *a.shape[axis + 1:])

    def merge(self, a, axis):
        return a.reshape(*a.shape[:axis], a.shape[axis] * a.shape[axis + 1], *a.shape[axis + 2:])

    def take(self, a, j, axis):
        return jax.lax.dynamic_index_in_dim(a, j, axis + (not self.major), keepdims=False)

    def put(self, a, block, j, axis):
        return jax.lax.dynamic_update_index_in_dim(a, block, j, axis + (not self.major))


# --- the pipeline ------------------------------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _pipelined(static, x, v0, w):
    (s, v), _ = _fwd(static, x, v0, w)
    return s, v


def _fwd(static, x, v0, w):
    cfg, ret_seq, _, shards, d, blocks, kernel, mesh = static
    v_spec = P(TIME_AXIS) if ret_seq else P()
    body = functools.partial(_forward_body, cfg, ret_seq, kernel, shards, d, blocks)
    s, v, v_in = jax.shard_map(body, mesh=mesh, in_specs=(P(TIME_AXIS), P(TIME_AXIS), P(), P()),
                               out_specs=(P(TIME_AXIS), v_spec, P(TIME_AXIS)), axis_names={TIME_AXIS},
                               check_vma=False)(_device_index(shards), x, v0, w)
    return (s, v), (x, v_in, w)


def _bwd(static, res, cts):
    cfg, ret_seq, has_v_init, shards, d, blocks, kernel, mesh = static
    x, v_in, w = res
    ds, dv = cts
    v_spec = P(TIME_AXIS) if ret_seq else P()
    body = functools.partial(_backward_body, cfg, ret_seq, kernel, has_v_init, shards, d, blocks)
    dx, dv0, dw = jax.shard_map(body, mesh=mesh,
                                in_specs=(P(TIME_AXIS), P(TIME_AXIS), P(TIME_AXIS), P(), P(TIME_AXIS), v_spec),
                                out_specs=(P(TIME_AXIS), P(), P()), axis_names={TIME_AXIS},
                                check_vma=False)(_device_index(shards), x, v_in, w, ds, dv)
    return dx, jax.tree.map(lambda g, a: g.astype(a.dtype), dv0, v_in), dw


_pipelined.defvjp(_fwd, _bwd)


def _device_index(shards: int) -> jax.Array:
    """``[P]`` int32, split over ``time``: each device's block is its own index. Passed in rather than read with
    ``lax.axis_index``, whose partition-id XLA's SPMD partitioner refuses in some programs with other axes left
    automatic (a transformer block under time x data x tensor)."""
    return jnp.arange(shards, dtype=jnp.int32)


# --- the exchange between neighbouring devices -----------------------------------------------------------


def exchange_by_gather() -> bool:
    """Whether blocks pass between time devices by an all-gather (else a ``ppermute``): on the CPU backend inside
    a ``shard_map`` manual over another axis too (a pipeline stage), where the neuron runs in one branch of the
    stage's ``lax.switch``. XLA:CPU runs a collective-permute as a rendezvous of every device of the program,
    which devices in another branch never join (a deadlock); an all-gather meets only its own group."""
    mesh = jax.sharding.get_abstract_mesh()
    return jax.default_backend() == "cpu" and bool(set(mesh.manual_axes) - {TIME_AXIS})


def _shift(a, k, shards: int, step: int):
    """What device ``k - step`` sends, on device ``k`` (zeros where there is no such device)."""
    if not exchange_by_gather():
        pairs = [(q, q + step) for q in range(shards) if 0 <= q + step < shards]
        return jax.lax.ppermute(a, TIME_AXIS, pairs)
    every = jax.lax.all_gather(a, TIME_AXIS)
    src = k - step
    got = jax.lax.dynamic_index_in_dim(every, jnp.clip(src, 0, shards - 1), keepdims=False)
    return jnp.where((src >= 0) & (src < shards), got, jnp.zeros_like(got))


# --- one block: x [T/P, ...] from its start potential v [...] ----------------------------------------------


def _flat(kernel, x, v):
    """The block as the kernels take it: ``x [T/P, m]`` in the kernel's compute dtype, ``v [m]``."""
    return x.reshape(x.shape[0], -1).astype(kernel.compute_dtype(x.dtype)), v.reshape(-1)


def _block_forward(cfg, ret_seq, kernel, x, v, w):
    """``(s [T/P, ...], v, final)`` of one block (``v`` the state sequence with ``ret_seq``, else the final state;
    ``final`` the final state, a dict for a ``StepNeuron``)."""
    if isinstance(cfg, B.StepNeuron):
        s, v_seq, last = _step_run(kernel)(cfg, x, v, w, return_v_seq=ret_seq)
        return s, (v_seq if ret_seq else last), last
    s, v = _kernel_block_forward(cfg, ret_seq, kernel, x, v, w)
    return s, v, (v[-1] if ret_seq else v)


def _step_run(kernel):
    """How a ``StepNeuron``'s block runs: ``scan.run``, or the kernel generated from its step (per device share
    where the partitioner splits the block further); ``(outs, V's sequence or None, final state dict)``."""
    if kernel is None:
        return scan.run
    return functools.partial(sharded.run, kernel, split=other_axes_split())


def _kernel_block_forward(cfg, ret_seq, kernel, x, v, w):
    if kernel is None:
        return xla.multistep(cfg, x, v, w, return_v_seq=ret_seq)
    if other_axes_split():  # the partitioner splits the block further: the kernel per device, on its share
        return sharded.multistep(kernel, cfg, x, v, w, return_v_seq=ret_seq)
    (s, v_out), _ = kernel.forward(cfg, ret_seq, *_flat(kernel, x, v), w)
    return s.astype(x.dtype).reshape(x.shape), v_out.reshape(x.shape if ret_seq else v.shape)


def _block_backward(cfg, ret_seq, kernel, x, v, w, ds, dv, d_last=None):
    """``(dx, dv_start, dw)`` of one block from the cotangents of its spikes and states, recomputing its forward
    (a ``StepNeuron``: ``dv`` that of the state sequence, None without ``ret_seq``, and ``d_last`` that of the
    final state dict)."""
    if isinstance(cfg, B.StepNeuron):
        run = _step_run(kernel)
        _, vjp = jax.vjp(lambda x, v, w: run(cfg, x, v, w, return_v_seq=ret_seq), x, v, w)
        return vjp((ds, dv, d_last))
    if kernel is None or other_axes_split():
        run = xla.multistep if kernel is None else functools.partial(sharded.multistep, kernel)
        _, vjp = jax.vjp(lambda x, v, w: run(cfg, x, v, w, return_v_seq=ret_seq), x, v, w)
        return vjp((ds, dv))
    xf, vf = _flat(kernel, x, v)
    _, saved = kernel.forward(cfg, ret_seq, xf, vf, w)  # the native kernels save nothing: dead code for XLA
    dx, dv0, dw = kernel.backward(cfg, ret_seq, xf, saved, vf, w, ds.reshape(xf.shape),
                                  dv.reshape(xf.shape if ret_seq else vf.shape))
    return dx.astype(x.dtype).reshape(x.shape), dv0.reshape(v.shape), dw


def tree_take(blocks: _Blocks, tree, j, axis):
    """Block ``j`` of every array of ``tree`` (a state dict, or one array)."""
    return jax.tree.map(lambda a: blocks.take(a, j, axis), tree)


# --- the two pipelines ---------------------------------------------------------------------------------------


def _forward_body(cfg, ret_seq, kernel, shards, d, blocks, index, x, v0, w):
    """One device: ``x [T/P, *view]`` -> spikes, ``v`` (sequence, or the last device's final state), and
    the start potential of each neuron's segment ``[1, *view]``."""
    k = index[0]
    sdt, nb = jax.tree.leaves(v0)[0].dtype, blocks.count
    xb, v0b = blocks.split(x, d + 1), jax.tree.map(lambda a: blocks.split(a, d), v0)
    s_buf = jnp.zeros(xb.shape, x.dtype)
    v_buf = jnp.zeros(xb.shape, sdt) if ret_seq else jax.tree.map(jnp.zeros_like, v0b)
    vin_buf = jax.tree.map(jnp.zeros_like, v0b)
    v_recv = tree_take(blocks, v0b, 0, d)

    def tick(carry, i):
        v_recv, v_prev, s_buf, v_buf, vin_buf = carry
        j = i - k
        valid = (j >= 0) & (j < nb)
        jc = jnp.clip(j, 0, nb - 1)
        # After its last block a device recomputes that block from the same start (the same values again).
        v_start = jax.tree.map(lambda prev, own, recv: jnp.where(j >= nb, prev, jnp.where(k == 0, own, recv)),
                               v_prev, tree_take(blocks, v0b, jc, d), v_recv)
        s, v, v_last = _block_forward(cfg, ret_seq, kernel, blocks.take(xb, jc, d + 1), v_start, w)
        s_buf = blocks.put(s_buf, s, jc, d + 1)
        v_buf = jax.tree.map(lambda buf, a: blocks.put(buf, a, jc, d + 1 if ret_seq else d), v_buf, v)
        vin_buf = jax.tree.map(lambda buf, a: blocks.put(buf, a, jc, d), vin_buf, v_start)
        v_send = jax.tree.map(lambda a: jnp.where(valid, a, jnp.zeros_like(a)), v_last)
        v_recv = jax.tree.map(lambda a: _shift(a, k, shards, +1), v_send)
        return (v_recv, v_start, s_buf, v_buf, vin_buf), None

    init = (v_recv, v_recv, s_buf, v_buf, vin_buf)
    (*_, s_buf, v_buf, vin_buf), _ = jax.lax.scan(tick, init, jnp.arange(nb + shards - 1))
    s = blocks.merge(s_buf, d + 1)
    if ret_seq:
        v = blocks.merge(v_buf, d + 1)
    else:  # the final state lives on the last device; every device returns it
        v = jax.tree.map(lambda buf: jax.lax.psum(jnp.where(k == shards - 1, blocks.merge(buf, d), 0), TIME_AXIS),
                         v_buf)
    return s, v, jax.tree.map(lambda buf: blocks.merge(buf, d)[None], vin_buf)


def _backward_body(cfg, ret_seq, kernel, has_v_init, shards, d, blocks, index, x, v_in, w, ds, dv):
    """One device: the reverse pipeline; returns ``dx [T/P, *view]``, ``dv_init [*view]`` (a dict for a
    ``StepNeuron``) and the parameters' gradients (PLIF's ``dw``, a ``StepNeuron``'s params pytree)."""
    k = index[0]
    step_neuron = isinstance(cfg, B.StepNeuron)
    nb = blocks.count
    xb, dsb = blocks.split(x, d + 1), blocks.split(ds, d + 1)
    vinb = jax.tree.map(lambda a: blocks.split(a[0], d), v_in)
    dvb = jax.tree.map(lambda a: blocks.split(a, d + 1 if ret_seq else d), dv)
    dx_buf = jnp.zeros(xb.shape, x.dtype)
    dv0_buf = jax.tree.map(jnp.zeros_like, vinb)
    g_recv = tree_take(blocks, dv0_buf, 0, d)
    has_w = step_neuron or cfg.kind == "PLIF"
    dw = jax.tree.map(jnp.zeros_like, w) if has_w else None

    def tick(carry, i):
        g_recv, g_prev, dx_buf, dv0_buf, dw = carry
        j = i - (shards - 1 - k)
        valid = (j >= 0) & (j < nb)
        jc = jnp.clip(j, 0, nb - 1)
        # after its last block, that block again (as in the forward)
        g = jax.tree.map(lambda prev, recv: jnp.where(j >= nb, prev, recv), g_prev, g_recv)
        x_j, v_j, ds_j = blocks.take(xb, jc, d + 1), tree_take(blocks, vinb, jc, d), blocks.take(dsb, jc, d + 1)
        if step_neuron:  # dL/d(final state): the next segment's, or on the last device the caller's
            d_last = g if ret_seq else jax.tree.map(
                lambda own, recv: jnp.where(k == shards - 1, own.astype(recv.dtype), recv),
                tree_take(blocks, dvb, jc, d), g)
            dv_seq = blocks.take(dvb, jc, d + 1) if ret_seq else None
            dx_j, dv0_j, dw_j = _block_backward(cfg, ret_seq, kernel, x_j, v_j, w, ds_j, dv_seq, d_last)
        else:
            if ret_seq:  # dL/dV of the segment's last step: its own cotangent plus what the next segment sends
                dv_j = blocks.take(dvb, jc, d + 1)
                dv_j = dv_j.at[-1].set(dv_j[-1] + g.astype(dv_j.dtype))
            else:
                dv_j = jnp.where(k == shards - 1, blocks.take(dvb, jc, d).astype(g.dtype), g)
            dx_j, dv0_j, dw_j = _block_backward(cfg, ret_seq, kernel, x_j, v_j, w, ds_j, dv_j)
        dx_buf = blocks.put(dx_buf, dx_j, jc, d + 1)
        dv0_buf = jax.tree.map(lambda buf, a: blocks.put(buf, a, jc, d), dv0_buf, dv0_j)
        if has_w:
            dw = jax.tree.map(lambda acc, a: acc + jnp.where(valid, a, jnp.zeros_like(a)), dw, dw_j)
        g_send = jax.tree.map(lambda a: jnp.where(valid, a, jnp.zeros_like(a)), dv0_j)
        g_recv = jax.tree.map(lambda a: _shift(a, k, shards, -1), g_send)
        return (g_recv, g, dx_buf, dv0_buf, dw), None

    init = (g_recv, g_recv, dx_buf, dv0_buf, dw)
    (*_, dx_buf, dv0_buf, dw), _ = jax.lax.scan(tick, init, jnp.arange(nb + shards - 1))
    dv0 = jax.tree.map(lambda buf: blocks.merge(buf, d), dv0_buf)
    if has_v_init:
        dv0 = jax.tree.map(lambda a: jax.lax.psum(jnp.where(k == 0, a, jnp.zeros_like(a)), TIME_AXIS), dv0)
    else:  # the fresh start is a constant: its cotangent is not wanted
        dv0 = jax.tree.map(jnp.zeros_like, dv0)
    if has_w:
        dw = jax.tree.map(lambda a: jax.lax.psum(a, TIME_AXIS), dw)
    return blocks.merge(dx_buf, d + 1), dv0, dw
