"""Temporal parallelism benchmark: a LIF layer and a whole train step versus the number of time shards.

    python -m snnjax.bench.temporal [--T 64] [--shards 1,2,4,8] [--what layer,model] [--batch 2]
        [--width-div 4] [--repeats 3] [--out benchmarks/results/temporal_cpu.jsonl]

One JSON line per (what, T, P): T split over ``time=P`` (P = 1: the unsharded step on one device),
the compiled step's per-device memory (``memory_analysis``: arguments and temporaries, exact), its
collective-permute count and bytes per step (from the HLO, exact), the block schedule of the
pipelined neurons (blocks, bubble ``(P-1)/(B+P-1)``) and the median wall time of ``--repeats``
runs after a warm-up. ``layer``: LIF forward + backward on ``[T, N, 48, 48, 64]`` (CIFAR10DVSVGG's
first layer); ``model``: a CIFAR10DVSVGG train step (Adam) with the widths divided by ``--width-div``.
Fakes 8 CPU devices when no accelerator is present; on a 2-core CPU the fake devices share the
cores, so times there show overheads, not the speed-up of real devices.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from snnjax.bench.common import append_jsonl, git_commit

DEFAULT_OUT = "benchmarks/results/temporal_cpu.jsonl"
NOTE = "shared 2-core CPU, fake devices share the cores: times are noisy; memory and bytes are exact"


def _median_ms(fn, repeats: int) -> float:
    import jax

    jax.block_until_ready(fn())  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 2)


def _costs(compiled) -> dict:
    from snnjax.parallel import report

    mem = report.memory_stats(compiled)
    perm = report.collective_stats(compiled.as_text())["collective-permute"]
    return {"argument_bytes_per_device": mem.get("argument_bytes"), "temp_bytes_per_device": mem.get("temp_bytes"),
            "collective_permute_count": perm["count"], "collective_permute_bytes": perm["bytes"]}


def _mesh(shards: int):
    import jax

    from snnjax.parallel import mesh as mesh_lib

    return mesh_lib.make_mesh(f"time={shards}", jax.devices()[:shards])


def layer_record(t: int, shards: int, batch: int, repeats: int) -> dict:
    """LIF forward + backward on ``[t, batch, 48, 48, 64]`` float32 with T over ``time=shards``."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from snnjax.neurons import base as B
    from snnjax.neurons import dispatch, temporal

    shape = (t, batch, 48, 48, 64)
    mesh = _mesh(shards)
    cfg = B.NeuronConfig(kind="LIF")

    def fwd_bwd(x, ds):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            s, vjp = jax.vjp(lambda x: dispatch.multistep(cfg, x, impl="xla")[0], x)
            return s, vjp(ds)[0]

    sharding = NamedSharding(mesh, P("time"))
    x = jax.device_put(jax.random.normal(jax.random.key(0), shape, jnp.float32) + 0.5, sharding)
    ds = jax.device_put(jax.random.normal(jax.random.key(1), shape, jnp.float32), sharding)
    compiled = jax.jit(fwd_bwd).lower(x, ds).compile()
    rec = {"what": "layer", "shape": list(shape), **_costs(compiled),
           "ms": _median_ms(lambda: compiled(x, ds), repeats)}
    if shards > 1:
        s = temporal.layer_schedule(shape, shards)
        rec.update(blocks=s.blocks, block_view=list(temporal.block_view(shape[1:])), block_dim=s.dim,
                   bubble=round(s.bubble, 4), expected_bytes=s.bytes_sent)
    return rec


def model_record(t: int, shards: int, batch: int, width_div: int, repeats: int, impl: str = "auto") -> dict:
    """A CIFAR10DVSVGG train step at ``[t, batch, 48, 48, 2]`` with T over ``time=shards`` (``impl``: the
    neurons' implementation when T is whole; time-sharded neurons always pipeline the xla path)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from snnjax import parallel
    from snnjax.models import CIFAR10DVSVGG
    from snnjax.models.vgg import DEFAULT_WIDTHS
    from snnjax.neurons import temporal
    from snnjax.neurons.modules import BaseNode
    from snnjax.train import apply_plan
    from snnjax.train.step import StepConfig, TrainState, split_model

    widths = tuple(max(w // width_div, 1) for w in DEFAULT_WIDTHS)
    model = CIFAR10DVSVGG(widths=widths, dropout=0.0, rngs=nnx.Rngs(0))
    for _, module in nnx.iter_modules(model):
        if isinstance(module, BaseNode):
            module.impl = impl
    graphdef, params, rngs, rest = split_model(model)
    tx = optax.adam(1e-3)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                       opt_state=tx.init(params))
    p = parallel.plan(model, _mesh(shards))
    shape = (t, batch, 48, 48, 2)
    state, step = apply_plan(p, state, StepConfig(seed=0, time_steps=t, encoder=None), graphdef, tx,
                             batch_axes={"inputs": 1, "labels": 0}, batch_ndims={"inputs": 5, "labels": 1})
    batch_arrays = {"inputs": jax.device_put((jax.random.uniform(jax.random.key(1), shape) < 0.3).astype(jnp.float32),
                                             p.batch_sharding(5, 1)),
                    "labels": jax.device_put(jnp.arange(batch) % 10, p.batch_sharding(1, 0))}
    compiled = step.lower(state, batch_arrays).compile()
    holder = {"state": state}

    def run():
        holder["state"], metrics = compiled(holder["state"], batch_arrays)
        return metrics["loss"]

    rec = {"what": "model", "model": "cifar10dvs_vgg", "neuron_impl": impl if shards == 1 else "temporal(xla)",
           "widths": list(widths), "shape": list(shape),
           **_costs(compiled), "ms": _median_ms(run, repeats)}
    if shards > 1:
        first = temporal.layer_schedule((t, batch, 48, 48, widths[0]), shards)  # the first block's neurons
        rec.update(blocks_first_layer=first.blocks, bubble_first_layer=round(first.bubble, 4))
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m snnjax.bench.temporal")
    ap.add_argument("--T", default="64", help="comma-separated time step counts")
    ap.add_argument("--shards", default="1,2,4,8", help="comma-separated sizes of the time axis")
    ap.add_argument("--what", default="layer,model", help="layer, model or both")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--width-div", type=int, default=4, help="CIFAR10DVSVGG's widths divided by this")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=DEFAULT_OUT, help="JSONL file the records are appended to ('' for none)")
    args = ap.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

    import jax

    commit = git_commit()
    for what in args.what.split(","):
        for t in (int(v) for v in args.T.split(",")):
            for shards in (int(v) for v in args.shards.split(",")):
                if shards > jax.device_count() or t % shards:
                    print(f"skip {what} T={t} time={shards}: {jax.device_count()} devices", file=sys.stderr)
                    continue
                if what == "layer":
                    records = [layer_record(t, shards, args.batch, args.repeats)]
                else:  # on one device both the default neuron kernels and the xla path the pipeline runs
                    records = [model_record(t, shards, args.batch, args.width_div, args.repeats, impl)
                               for impl in (("auto", "xla") if shards == 1 else ("auto",))]
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
