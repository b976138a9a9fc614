"""Pipeline-parallel gradients over the ``stage`` mesh axis: a schedule's ticks run in one ``lax.scan``.

    spec = PipelineSpec("1f1b", stages=4, microbatches=8, layout=(3, 2, 2, 2))
    grads, model_state, loss_sum, acc_sum = pipeline_gradients(spec, mesh, cfg, graphdef, params, rngs,
                                                               model_state, xs, ys, drop_key)

The model is a chain of units (``model.units()``, ``snnjax.models.units``); ``layout`` gives each virtual stage its
consecutive units (stage ``g`` lives on device ``g % S``). Inside a ``shard_map`` that is manual
over ``stage`` only (the other axes stay with the SPMD partitioner, so data / fsdp / tensor
layouts work inside a stage unchanged), every device runs, per tick, the action its column of
the schedule's tables names (``snnjax.parallel.pipeline_tables``) through ``lax.switch``:

* F of stage ``g``: the stage's forward on its input (the microbatch for ``g = 0``, else the
  activation received from device ``g - 1``); BatchNorm statistics are updated here, once per
  microbatch in microbatch order; the last stage computes the loss.
* B: the stage's forward again from the kept stage input, and its VJP: the input cotangent goes to
  the previous stage and (combined backward) the parameter gradients are accumulated.
* W (zero-bubble): B runs only the input-gradient half of the backward and stores, per weight layer, the
  layer's input and output cotangent (``snnjax.parallel.weight_split``); W runs the weight-gradient
  contractions on them, with neither the forward nor the cotangent chain.

Nothing is differentiated through the tick loop, so a stage holds only the stage inputs the
schedule has in flight (1F1B: at most S; GPipe: M), in a buffer sized by the tables. After
every tick the devices exchange one activation (forward ring) and one cotangent (backward ring)
by ``ppermute``: ``[mb, T, F_max]`` buffers (each time step's features flattened and padded), so heterogeneous
stages send the same shape and a split of the microbatch or of time stays in place.
Idle ticks compute nothing and send zeros; what arrives for nobody is written to a trash slot,
and a device's gradients and statistics are taken from it with ``jnp.where`` (never a 0/1
multiply), so no garbage reaches a gradient.

Each microbatch starts from fresh neuron state (the multi-step neurons are pure) and normalises
with its own batch statistics; the dropout key of microbatch ``m`` is that of ``train_step``'s
accumulation loop, so the summed gradients equal non-pipelined training with the same
microbatching.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, PartitionSpec

from snnjax.parallel import pipeline_tables, schedules, weight_split
from snnjax.parallel.stage_params import StagePacking, leaf_stages
from snnjax.parallel.variables import fresh, owner, path_str

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero_bubble")


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """Static pipeline settings: schedule name, devices on ``stage``, virtual stages per device,
    microbatches, and units per virtual stage (``len(layout) == stages * virtual``)."""

    schedule: str
    stages: int
    microbatches: int
    layout: tuple[int, ...]
    virtual: int = 1

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"pipeline schedule must be one of {list(SCHEDULES)}, got {self.schedule!r}")
        if self.virtual != 1 and self.schedule != "interleaved":
            raise ValueError(f"virtual stages > 1 need the 'interleaved' schedule, not {self.schedule!r}")
        if len(self.layout) != self.stages * self.virtual or min(self.layout, default=0) < 1:
            raise ValueError(f"the layout {self.layout} must give each of the {self.stages} x {self.virtual} "
                             "(virtual) stages at least one unit")

    def make_schedule(self) -> schedules.Schedule:
        s, m = self.stages, self.microbatches
        if self.schedule == "gpipe":
            return schedules.gpipe(s, m)
        if self.schedule == "1f1b":
            return schedules.one_f_one_b(s, m)
        if self.schedule == "zero_bubble":
            return schedules.zero_bubble(s, m)
        return schedules.interleaved(s, m, self.virtual)

    def unit_ranges(self) -> list[tuple[int, int]]:
        """``[lo, hi)`` unit indices of each virtual stage."""
        edges = np.cumsum((0,) + tuple(self.layout))
        return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def _to_flat(x: jax.Array, width: int) -> jax.Array:
    """``[T, mb, ...]`` -> ``[mb, T, width]`` (zero-padded): the microbatch and time dims stay dims of their own,
    so their shardings (data / fsdp, time) survive the send."""
    flat = jnp.moveaxis(x, 1, 0).reshape(x.shape[1], x.shape[0], -1)
    return jnp.pad(flat, ((0, 0), (0, 0), (0, width - flat.shape[2])))


def _from_flat(buf: jax.Array, shape: Sequence[int]) -> jax.Array:
    """Inverse of ``_to_flat`` for an activation of ``shape`` ``[T, mb, ...]``."""
    t, mb, *rest = shape
    return jnp.moveaxis(buf[:, :, :math.prod(rest)].reshape(mb, t, *rest), 0, 1)


def pipeline_gradients(spec: PipelineSpec, mesh: Mesh, graphdef: nnx.GraphDef, params, rngs, model_state,
                       xs: jax.Array, ys: jax.Array, drop_key: jax.Array, *, loss_fn, acc_dtype,
                       packing: StagePacking | None = None, grad_axes: tuple[str, ...] = ()):
    """Summed gradients over ``M`` microbatches through the pipeline.

    ``xs [M, T, mb, ...]`` the microbatches' model inputs, ``ys [M, mb]`` their labels;
    ``loss_fn(logits, labels) -> (loss, accuracy)`` (per-microbatch means, scalars in ``acc_dtype``). Returns
    ``(grads, model_state, loss_sum, acc_sum)``: gradients of the summed per-microbatch losses,
    BatchNorm statistics after the M microbatches, and the sums of the losses and accuracies.
    With ``packing`` (``snnjax.parallel.stage_params``), ``params`` and the gradients are ``[S, width]``, sharded
    over ``stage``: each device reads its stages' parameters from its own row and writes their gradients there.
    The rows, and the parameters and gradients cut from them, are whole on every device of a stage (the
    layers then take their shards locally); left to propagation, cutting a row that the partitioner had
    split needed collective-permutes inside a stage's branch, which XLA:CPU runs as a rendezvous of every
    device (a deadlock). ``grad_axes``: mesh axes within a stage that split the accumulated gradient row (ZeRO-2:
    each B or W adds its gradients reduce-scattered to the device's share).
    """
    sched = spec.make_schedule()
    schedules.validate(sched)
    tables = pipeline_tables.build(sched)
    num_g, s_count = sched.num_stages, spec.stages
    ranges = spec.unit_ranges()

    params_in = params
    if packing is not None:  # the tree, abstract: every device builds its stages' parameters from its own row
        params = packing.abstract_tree()
    probe = nnx.merge(graphdef, params, fresh(rngs), fresh(model_state))
    units = probe.units()
    if ranges[-1][1] != len(units):
        raise ValueError(f"the pipeline layout {spec.layout} covers {ranges[-1][1]} units, but the model has "
                         f"{len(units)} ({[u.name for u in units]}); the counts must add up to {len(units)}")
    unit_stage = np.repeat(np.arange(num_g), spec.layout)
    owns = [u.owns for u in units]
    p_values, p_def = jax.tree.flatten(params)
    if packing is None:
        params_in = p_values
    leaf_stage = leaf_stages(params, owns, spec.layout)
    own = [[i for i, st in enumerate(leaf_stage) if st == g] for g in range(num_g)]

    def run_stage(g, own_values, all_values, ms, x, m, rngs=rngs, drop_key=drop_key):
        values = list(all_values)
        for i, v in zip(own[g], own_values, strict=True):
            values[i] = v
        model = nnx.merge(graphdef, jax.tree_util.tree_unflatten(p_def, values), fresh(rngs), fresh(ms))
        nnx.reseed(model, dropout=jax.random.fold_in(drop_key, m))
        lo, hi = ranges[g]
        y = x
        for unit in model.units()[lo:hi]:
            y = unit(y)
        return y, nnx.split(model, nnx.Param, nnx.RngState, ...)[3]

    # Shapes of each stage's input and output for one microbatch.
    in_shapes, x_shape = [], jax.ShapeDtypeStruct(xs.shape[1:], xs.dtype)
    for g in range(num_g):
        in_shapes.append(x_shape)
        x_shape = jax.eval_shape(lambda v, x, g=g: run_stage(g, [v[i] for i in own[g]], v, model_state, x, 0)[0],
                                 p_values, x_shape)
    mb = xs.shape[2]
    width = max([math.prod(a.shape[2:]) for a in in_shapes[1:]] + [1])
    act_dtype, t_steps = xs.dtype, xs.shape[1]
    for g, a in enumerate(in_shapes[1:], 1):
        if a.dtype != act_dtype:
            raise ValueError(f"stage {g}'s input is {a.dtype}, the model input {act_dtype}; the pipeline sends "
                             "activations in one dtype")
        if a.ndim < 2 or a.shape[:2] != (t_steps, mb):
            raise ValueError(f"stage {g}'s input has shape {a.shape}; the pipeline sends time-major activations "
                             f"[T={t_steps}, microbatch={mb}, ...] between stages")

    def stage_loss(g, own_values, all_values, ms, x, m, y_labels, **keys):
        out, new_ms = run_stage(g, own_values, all_values, ms, x, m, **keys)
        if g < num_g - 1:
            return out, (new_ms, jnp.zeros((), acc_dtype))
        loss, correct = loss_fn(out, y_labels)
        return loss, (new_ms, correct)

    def body(stored, model_state_in, rngs_in, key_in, xs_local, ys_local):
        d = jax.lax.axis_index("stage")
        stage_loss_here = functools.partial(stage_loss, rngs=rngs_in, drop_key=key_in)

        def values_for(g):
            """Every parameter leaf for stage ``g``'s code: its own real, the others placeholders (unused)."""
            if packing is None:
                return stored
            mine = packing.leaves_of(_whole(stored[0]), g % s_count)
            mine = {i: _whole(v) for i, v in mine.items()}
            return [mine[i] if i in mine else jnp.zeros(v.shape, v.dtype) for i, v in enumerate(p_values)]
        # Zero-bubble: B runs the input-gradient half of the stage's backward and stores what the weight-gradient
        # half (W) reads (``weight_split``), each array in a buffer of its own shape (reshaping split arrays would
        # reshard them). Stages share buffers of equal shape and dtype: the pool holds, per shape, the most any
        # one stage needs.
        w_source, w_split, w_slot_of, pool = {}, {}, {}, []
        if sched.split_backward:
            for g in range(num_g):
                out_like = in_shapes[g + 1] if g + 1 < num_g else jax.ShapeDtypeStruct((), acc_dtype)
                w_split[g], w_source[g] = _backward_split(
                    functools.partial(stage_loss_here, g), own[g], values_for(g), model_state_in, in_shapes[g], ys,
                    out_like, g == 0)
                w_slot_of[g] = _pool_slots(pool, [(tuple(a.shape), jnp.dtype(a.dtype)) for a in w_split[g].stored])

        f_max = width

        def stage_input(g, act_buf, slot, m):
            if g == 0:
                return jax.lax.dynamic_index_in_dim(xs_local, m, keepdims=False)
            return _from_flat(jax.lax.dynamic_index_in_dim(act_buf, slot, keepdims=False), in_shapes[g].shape)

        zeros_send = jnp.zeros((mb, t_steps, f_max), act_dtype)

        def vjp_of(g, values, carry, x, m):
            labels = jax.lax.dynamic_index_in_dim(ys_local, m, keepdims=False)
            return _stage_vjp(functools.partial(stage_loss_here, g), own[g], values, carry["ms"], x, m, labels, g == 0)

        def out_cotangent(g, carry, slot):
            if g == num_g - 1:
                return jnp.ones((), acc_dtype)
            buf = jax.lax.dynamic_index_in_dim(carry["cot"], slot, keepdims=False)
            shape = in_shapes[g + 1].shape
            return _from_flat(buf, shape)

        def add_grads(g, grads, d_own):
            if packing is not None:
                row = packing.row(g % s_count, {i: _whole(dv) for i, dv in zip(own[g], d_own, strict=True)})
                return _grad_row(grads + row)
            grads = list(grads)
            for i, dv in zip(own[g], d_own, strict=True):
                grads[i] = grads[i] + dv
            return grads

        def f_branch(g, carry, row):
            m = row["microbatch"]
            x = stage_input(g, carry["act"], row["act_read"], m)
            labels = jax.lax.dynamic_index_in_dim(ys_local, m, keepdims=False)
            values = values_for(g)
            out, (ms, correct) = stage_loss_here(g, [values[i] for i in own[g]], values, carry["ms"], x, m, labels)
            carry = dict(carry, ms=ms)
            if g == num_g - 1:
                carry = dict(carry, loss=carry["loss"] + out, acc=carry["acc"] + correct)
                return carry, zeros_send, zeros_send
            return carry, _to_flat(out, f_max), zeros_send

        def b_branch(g, carry, row):
            m = row["microbatch"]
            x = stage_input(g, carry["act"], row["act_read"], m)
            values = values_for(g)
            vjp = vjp_of(g, values, carry, x, m)
            dy = out_cotangent(g, carry, row["cot_read"])
            if sched.split_backward:
                dx, stored = w_split[g].run_b(*_vjp_leaves(vjp, values, w_source[g]), dy)
                wbuf = list(carry["w"])
                for k, leaf in zip(w_slot_of[g], stored, strict=True):
                    wbuf[k] = jax.lax.dynamic_update_index_in_dim(wbuf[k], leaf, row["w_write"], 0)
                return dict(carry, w=wbuf), zeros_send, zeros_send if g == 0 else _to_flat(dx[0], f_max)
            cts = vjp(dy)
            send = zeros_send if g == 0 else _to_flat(cts[1], f_max)
            return dict(carry, grads=add_grads(g, carry["grads"], cts[0])), zeros_send, send

        def w_branch(g, carry, row):
            # The weight-gradient contractions on what B stored (and the parameters): no forward, no cotangent chain.
            kept = [jax.lax.dynamic_index_in_dim(carry["w"][k], row["w_read"], keepdims=False) for k in w_slot_of[g]]
            values = values_for(g)
            d_own = w_split[g].run_w(kept, [values[w_source[g][i]] for i in w_split[g].direct_inputs])
            return dict(carry, grads=add_grads(g, carry["grads"], d_own)), zeros_send, zeros_send

        def idle(carry, row):
            return carry, zeros_send, zeros_send

        branches = [idle] + [functools.partial(f_branch, g) for g in range(num_g)]
        branches += [functools.partial(b_branch, g) for g in range(num_g)]
        if sched.split_backward:
            branches += [functools.partial(w_branch, g) for g in range(num_g)]

        def tick(carry, row_all):
            row = {k: v[d] for k, v in row_all.items()}
            carry, send_fwd, send_bwd = jax.lax.switch(row["branch"], branches, carry, row)
            fwd = jax.lax.ppermute(send_fwd, "stage", [(i, (i + 1) % s_count) for i in range(s_count)])
            bwd = jax.lax.ppermute(send_bwd, "stage", [(i, (i - 1) % s_count) for i in range(s_count)])
            carry = dict(carry, act=jax.lax.dynamic_update_index_in_dim(carry["act"], fwd, row["act_write"], 0),
                         cot=jax.lax.dynamic_update_index_in_dim(carry["cot"], bwd, row["cot_write"], 0))
            return carry, None

        carry = {
            "act": jnp.zeros((tables.act_slots + 1, mb, t_steps, f_max), act_dtype),
            "cot": jnp.zeros((tables.cot_slots + 1, mb, t_steps, f_max), act_dtype),
            "w": [jnp.zeros((tables.w_slots, *shape), dtype) for shape, dtype in pool],  # only B writes: no trash
            "grads": (_grad_row(jnp.zeros(packing.width, packing.dtype)) if packing is not None
                      else [jnp.zeros(v.shape, v.dtype) for v in stored]),
            "ms": model_state_in,
            "loss": jnp.zeros((), acc_dtype),
            "acc": jnp.zeros((), acc_dtype),
        }
        carry, _ = jax.lax.scan(tick, carry, {k: jnp.asarray(v) for k, v in tables.arrays().items()})
        # Each leaf's gradient and BatchNorm statistics live on the device of the stage that owns them.
        if packing is not None:  # each device's row holds its own stages' gradients
            grads = carry["grads"][None]
        else:
            mine = [leaf_stage[i] % s_count == d for i in range(len(p_values))]
            grads = [jax.lax.psum(jnp.where(keep, gr, 0), "stage")
                     for gr, keep in zip(carry["grads"], mine, strict=True)]
        ms_leaves, ms_def = jax.tree_util.tree_flatten_with_path(carry["ms"])
        ms_out = [jax.lax.psum(jnp.where(ms_owner[path_str(p)] % s_count == d, v, 0), "stage")
                  for p, v in ms_leaves]
        ms_out = jax.tree_util.tree_unflatten(ms_def, ms_out)
        last = (num_g - 1) % s_count == d
        loss = jax.lax.psum(jnp.where(last, carry["loss"], 0), "stage")
        acc = jax.lax.psum(jnp.where(last, carry["acc"], 0), "stage")
        return grads, ms_out, loss, acc

    def _grad_row(row):
        return jax.lax.with_sharding_constraint(row, PartitionSpec(grad_axes or None)) if grad_axes else row

    # Which stage owns each piece of model state (BatchNorm statistics, neuron state).
    ms_owner = {}
    for p, _ in jax.tree_util.tree_flatten_with_path(model_state)[0]:
        ms_owner[path_str(p)] = int(unit_stage[owner(owns, path_str(p))])

    specs, rows = PartitionSpec(), PartitionSpec("stage")
    packed = packing is not None
    fn = jax.shard_map(body, mesh=mesh, in_specs=(rows if packed else specs,) + (specs,) * 5,
                       out_specs=(rows if packed else specs,) + (specs,) * 3, axis_names=frozenset({"stage"}),
                       check_vma=False)
    grads, ms_out, loss, acc = fn(params_in, model_state, rngs, drop_key, xs, ys)
    return (grads if packed else jax.tree_util.tree_unflatten(p_def, grads)), ms_out, loss, acc


def _whole(x: jax.Array) -> jax.Array:
    """``x`` unsplit over the mesh axes the partitioner handles (inside the ``shard_map`` over ``stage``)."""
    return jax.lax.with_sharding_constraint(x, PartitionSpec())


def _vjp_leaves(vjp, values, source):
    """The VJP's residual leaves, checked against the layout ``_backward_split`` found (``source``)."""
    leaves = jax.tree_util.tree_leaves(vjp)
    ids = {id(v): i for i, v in enumerate(values)}
    if [ids.get(id(leaf), -1) for leaf in leaves] != list(source):
        raise RuntimeError("the stage's VJP residuals differ between traces; the zero-bubble W cannot reuse them")
    return leaves


def _stage_vjp(stage_loss_g, own_g, values, ms, x, m, labels, first: bool):
    """The VJP of stage ``g``'s output (the loss on the last stage) in its own parameters and, after the first
    stage, its input."""
    own_values = [values[i] for i in own_g]
    if first:
        _, vjp, _ = jax.vjp(lambda ov: stage_loss_g(ov, values, ms, x, m, labels), own_values, has_aux=True)
    else:
        _, vjp, _ = jax.vjp(lambda ov, xx: stage_loss_g(ov, values, ms, xx, m, labels), own_values, x, has_aux=True)
    return vjp


def _backward_split(stage_loss_g, own_g, p_values, model_state, x_like, ys, out_like, first: bool):
    """Stage ``g``'s backward cut into B and W (``weight_split``), and the source of each of its VJP's leaves (the
    index of the parameter it is, or -1 for a residual)."""
    found = {}

    def probe(values, x, labels):
        vjp = _stage_vjp(stage_loss_g, own_g, values, model_state, x, 0, labels, first)
        leaves, found["treedef"] = jax.tree_util.tree_flatten(vjp)
        ids = {id(v): i for i, v in enumerate(values)}
        found["source"] = tuple(ids.get(id(leaf), -1) for leaf in leaves)
        return leaves

    like = jax.eval_shape(probe, p_values, x_like, jax.ShapeDtypeStruct(ys.shape[1:], ys.dtype))
    backward = jax.make_jaxpr(lambda leaves, ct: jax.tree.leaves(jax.tree.unflatten(found["treedef"], leaves)(ct)))
    direct = [i >= 0 for i in found["source"]] + [False]
    return weight_split.split(backward(like, out_like), len(own_g), direct), found["source"]


def _pool_slots(pool: list, signatures: Sequence[tuple]) -> list[int]:
    """Indices into ``pool`` (a list of ``(shape, dtype)``, extended as needed) for one stage's arrays: each array
    gets a distinct entry of its signature, so stages reuse entries other stages created."""
    taken, out = set(), []
    for sig in signatures:
        k = next((k for k, p in enumerate(pool) if p == sig and k not in taken), None)
        if k is None:
            pool.append(sig)
            k = len(pool) - 1
        taken.add(k)
        out.append(k)
    return out
