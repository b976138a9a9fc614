"""Temporal parallelism benchmark: a LIF layer and a whole train step versus the number of time shards.

    python -m snnjax.bench.temporal [--T 64] [--shards 1,2,4,8 | --mesh "time=2,data=4;data=8"]
        [--what layer,model] [--impls xla,native] [--batch 2] [--width 64] [--width-div 4] [--repeats 5]
        [--out benchmarks/results/temporal_cpu.jsonl]

One JSON line per (what, T, mesh, impl): T split over ``time=P`` (``--shards``; P = 1: the unsharded
step on one device) or over the ``time`` axis of a ``--mesh`` spec, the compiled step's per-device
memory (``memory_analysis``: arguments and temporaries, exact), its collectives per step (count and
result bytes per device of each kind, from the HLO, exact), the block schedule of the pipelined
neurons (blocks, bubble ``(P-1)/(B+P-1)``, what computes each block) and the median wall time of
``--repeats`` runs after a warm-up (0: compile only). ``--impls``: the neuron implementations
compared, timed interleaved (one run of each per repeat); under time sharding the implementation
each block runs (``xla``: the ``lax.scan`` path; ``native`` / ``pallas``: that fused kernel; ``auto``: as
``snnjax.neurons.kernels.temporal.KERNEL_BLOCK_BACKENDS`` says). The model's neurons go through
``snnjax.neurons.kernels.dispatch``, so there the records' ``block_impl`` says what the dispatcher ran per
block. ``layer``: LIF forward + backward on ``[T, N, 48, 48, width]`` (CIFAR10DVSVGG's first layer);
``model``: a CIFAR10DVSVGG train step (Adam) with the widths divided by ``--width-div``, on the
layout the mesh's axes imply (``parallel.plan``; the batch must divide over ``data``).
Fakes 8 CPU devices when no accelerator is present; on a 2-core CPU the fake devices share the
cores, so times there show overheads, not the speed-up of real devices.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

from snnjax.bench.common import append_jsonl, git_commit

DEFAULT_OUT = "benchmarks/results/temporal_cpu.jsonl"
NOTE = "shared 2-core CPU, fake devices share the cores: times are noisy; memory and bytes are exact"


def _interleaved_ms(fns: list, repeats: int) -> list[float | None]:
    """Median wall time (ms) of each of ``fns`` over ``repeats`` rounds that run each once, after a warm-up."""
    import jax

    if repeats <= 0:
        return [None] * len(fns)
    for fn in fns:
        jax.block_until_ready(fn())
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, acc in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            acc.append((time.perf_counter() - t0) * 1e3)
    return [round(statistics.median(acc), 2) for acc in times]


def _costs(compiled) -> dict:
    from snnjax.parallel import report

    mem = report.memory_stats(compiled)
    stats = report.collective_stats(compiled.as_text())
    perm = stats["collective-permute"]
    return {"argument_bytes_per_device": mem.get("argument_bytes"), "temp_bytes_per_device": mem.get("temp_bytes"),
            "collective_permute_count": perm["count"], "collective_permute_bytes": perm["bytes"],
            "collectives": {kind: s for kind, s in stats.items() if s["count"]}}


def _mesh(spec: str):
    import jax

    from snnjax.parallel import mesh as mesh_lib

    n = math.prod(mesh_lib.parse_mesh_spec(spec).values())
    return mesh_lib.make_mesh(spec, jax.devices()[:n])


def _block_impls(schedules) -> str:
    """What computed the pipelined neurons' blocks (``+``-joined where layers differ)."""
    return "+".join(sorted({s.block_impl for _, s in schedules}))


def layer_records(t: int, spec: str, batch: int, width: int, impls: list[str], repeats: int) -> list[dict]:
    """LIF forward + backward on ``[t, batch, 48, 48, width]`` float32 with T over the ``time`` axis of ``spec``,
    one record per implementation in ``impls`` (per block under time sharding)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from snnjax.neurons import base as B
    from snnjax.neurons.kernels import dispatch, temporal

    shape = (t, batch, 48, 48, width)
    mesh = _mesh(spec)
    cfg = B.NeuronConfig(kind="LIF")
    sharding = NamedSharding(mesh, P("time", "data" if "data" in spec else None))
    x = jax.device_put(jax.random.normal(jax.random.key(0), shape, jnp.float32) + 0.5, sharding)
    ds = jax.device_put(jax.random.normal(jax.random.key(1), shape, jnp.float32), sharding)

    def fwd_bwd(impl):
        def run(x, ds):  # under time sharding the dispatcher runs impl per block
            with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), temporal.devices(mesh):
                s, vjp = jax.vjp(lambda x: dispatch.multistep(cfg, x, impl=impl)[0], x)
                return s, vjp(ds)[0]
        return run

    records, fns = [], []
    for impl in impls:
        with temporal.recording() as found:
            compiled = jax.jit(fwd_bwd(impl)).lower(x, ds).compile()
        ran = _block_impls(found) if found else dispatch.resolve_impl(impl, cfg, x)
        rec = {"what": "layer", "shape": list(shape), "mesh": spec, "neuron_impl": impl, "block_impl": ran,
               **_costs(compiled)}
        if found:
            s = found[0][1]
            rec.update(blocks=s.blocks, block_view=list(temporal.block_view(shape[1:])), block_dim=s.dim,
                       bubble=round(s.bubble, 4), expected_bytes=s.bytes_sent)
        records.append(rec)
        fns.append(lambda compiled=compiled: compiled(x, ds))
    for rec, ms in zip(records, _interleaved_ms(fns, repeats), strict=True):
        rec.update(ms=ms, repeats=repeats)
    return records


def model_records(t: int, spec: str, batch: int, width_div: int, impls: list[str], repeats: int) -> list[dict]:
    """A CIFAR10DVSVGG train step at ``[t, batch, 48, 48, 2]`` on the mesh ``spec`` (T over its ``time`` axis),
    one record per neuron ``impl`` in ``impls`` (the nodes' ``impl``; per block under time sharding)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from snnjax import parallel
    from snnjax.models import CIFAR10DVSVGG
    from snnjax.models.vgg import DEFAULT_WIDTHS
    from snnjax.neurons.kernels import temporal
    from snnjax.neurons.modules import BaseNode
    from snnjax.train import apply_plan
    from snnjax.train.step import StepConfig, TrainState, split_model

    widths = tuple(max(w // width_div, 1) for w in DEFAULT_WIDTHS)
    mesh = _mesh(spec)
    shape = (t, batch, 48, 48, 2)
    records, fns = [], []
    for impl in impls:
        model = CIFAR10DVSVGG(widths=widths, dropout=0.0, rngs=nnx.Rngs(0))
        for _, module in nnx.iter_modules(model):
            if isinstance(module, BaseNode):
                module.impl = impl
        graphdef, params, rngs, rest = split_model(model)
        tx = optax.adam(1e-3)
        state = TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                           opt_state=tx.init(params))
        p = parallel.plan(model, mesh)
        state, step = apply_plan(p, state, StepConfig(seed=0, time_steps=t, encoder=None), graphdef, tx,
                                 batch_axes={"inputs": 1, "labels": 0}, batch_ndims={"inputs": 5, "labels": 1})
        inputs = (jax.random.uniform(jax.random.key(1), shape) < 0.3).astype(jnp.float32)
        batch_arrays = {"inputs": jax.device_put(inputs, p.batch_sharding(5, 1)),
                        "labels": jax.device_put(jnp.arange(batch) % 10, p.batch_sharding(1, 0))}
        with temporal.recording() as found:
            compiled = step.lower(state, batch_arrays).compile()
        rec = {"what": "model", "model": "cifar10dvs_vgg", "mesh": spec, "neuron_impl": impl,
               "block_impl": _block_impls(found) if found else None, "widths": list(widths), "shape": list(shape),
               **_costs(compiled)}
        if found:
            first = found[0][1]  # the first layer's neurons
            rec.update(blocks_first_layer=first.blocks, bubble_first_layer=round(first.bubble, 4))
        records.append(rec)
        holder = {"state": state}

        def run(compiled=compiled, holder=holder, batch_arrays=batch_arrays):
            holder["state"], metrics = compiled(holder["state"], batch_arrays)
            return metrics["loss"]

        fns.append(run)
    for rec, ms in zip(records, _interleaved_ms(fns, repeats), strict=True):
        rec.update(ms=ms, repeats=repeats)
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m snnjax.bench.temporal")
    ap.add_argument("--T", default="64", help="comma-separated time step counts")
    ap.add_argument("--shards", default="1,2,4,8", help="comma-separated sizes of the time axis (mesh time=P)")
    ap.add_argument("--mesh", default="", help="semicolon-separated mesh specs to run instead of --shards "
                                               "(e.g. 'time=2,data=4;data=8')")
    ap.add_argument("--what", default="layer,model", help="layer, model or both")
    ap.add_argument("--impls", default="", help="comma-separated neuron implementations compared (per block under "
                                                "time sharding; default: xla and the backend's fused kernels)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--width", type=int, default=64, help="channels of the layer benchmark")
    ap.add_argument("--width-div", type=int, default=4, help="CIFAR10DVSVGG's widths divided by this")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds after a warm-up (0: compile only)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="JSONL file the records are appended to ('' for none)")
    args = ap.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

    import jax

    from snnjax.parallel import mesh as mesh_lib

    specs = [s for s in args.mesh.split(";") if s.strip()] or [f"time={v}" for v in args.shards.split(",")]
    impls = args.impls.split(",") if args.impls else ["xla", "pallas" if jax.default_backend() == "gpu" else "native"]
    commit = git_commit()
    for what in args.what.split(","):
        for t in (int(v) for v in args.T.split(",")):
            for spec in specs:
                sizes = mesh_lib.parse_mesh_spec(spec)
                shards = sizes.get("time", 1)
                if math.prod(sizes.values()) > jax.device_count() or t % shards:
                    print(f"skip {what} T={t} mesh {spec}: {jax.device_count()} devices", file=sys.stderr)
                    continue
                if what == "layer":
                    records = layer_records(t, spec, args.batch, args.width, impls, args.repeats)
                else:
                    records = model_records(t, spec, args.batch, args.width_div, impls, args.repeats)
                for rec in records:
                    _emit(args.out, {"bench": "temporal", **rec, "T": t, "time_shards": shards,
                                     "device_kind": jax.devices()[0].device_kind, "platform": jax.default_backend(),
                                     "jax_version": jax.__version__, "git_commit": commit,
                                     "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "note": NOTE})
    return 0


def _emit(out: str, rec: dict) -> None:
    print({k: rec[k] for k in rec if k not in ("device_kind", "jax_version", "git_commit", "note")}, flush=True)
    append_jsonl(out or None, rec)


if __name__ == "__main__":
    sys.exit(main())
