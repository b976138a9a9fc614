"""Pipeline memory and time per schedule: ``python -m snnjax.bench.pipeline``.

    python -m snnjax.bench.pipeline --model cifar10dvs_vgg --stages 2 4 --microbatches-per-stage 4 8 \\
        --microbatch-size 2 --T 4 --out benchmarks/results/pipeline_cpu.jsonl

For each schedule, stage count S, microbatch count M (given per stage: M = k * S) and
checkpointing policy (``--remat``) the pipelined train step (``parallel.mode=pp`` on ``stage=S``)
is compiled on S host devices with a fixed microbatch size, so the batch grows with M. One JSONL
record per compiled step: the compiled activation (temporary) bytes and peak per device from
XLA's memory analysis, the stage inputs the executor holds per device, the schedule's bubble
fraction, for zero-bubble the weight-gradient contractions each stage's W runs, and, with
``--steps``, the median step time. With a fixed microbatch size GPipe's activation memory grows
with M and 1F1B's with S only. Times on host devices that share a few cores are not meaningful;
memory and bubbles are exact.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="cifar10dvs_vgg", choices=("cifar10dvs_vgg", "spikformer_ti"))
    ap.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b", "interleaved", "zero_bubble"])
    ap.add_argument("--stages", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--microbatches-per-stage", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--microbatch-size", type=int, default=2)
    ap.add_argument("--T", type=int, default=4)
    ap.add_argument("--width-div", type=int, default=4, help="divide the model's widths by this (CPU sizes)")
    ap.add_argument("--spike-residuals", default="float", choices=("float", "int8", "bits"),
                    help="how layers after a neuron keep their 0/1 inputs for the backward")
    ap.add_argument("--remat", nargs="+", default=["none"], choices=("none", "units", "dots_saveable", "spikes"),
                    help="checkpointing policies to compile each schedule under (one layout, planned without)")
    ap.add_argument("--steps", type=int, default=0, help="timed steps after one warm-up (0: compile only)")
    ap.add_argument("--out", default=None, help="append JSONL records here")
    args = ap.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={max(args.stages)}")

    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from snnjax import parallel
    from snnjax.bench.common import append_jsonl, git_commit
    from snnjax.models import CIFAR10DVSVGG, remat, spikformer_ti
    from snnjax.parallel import mesh as mesh_lib
    from snnjax.parallel.pipeline_plan import PipelineOptions
    from snnjax.train import apply_plan
    from snnjax.train.memory_search import peak_bytes
    from snnjax.train.step import StepConfig, TrainState, split_model

    for stages in args.stages:
        for per_stage in args.microbatches_per_stage:
            m = per_stage * stages
            batch = m * args.microbatch_size
            if args.model == "cifar10dvs_vgg":
                widths = tuple(max(w // args.width_div, 1) for w in (64, 128, 256, 256, 512, 512, 512, 512))
                model = CIFAR10DVSVGG(widths=widths, rngs=nnx.Rngs(0))
                shape = (args.T, batch, 48, 48, 2)
            else:
                model = spikformer_ti(T=args.T, img_size_h=32,
                                      img_size_w=32, num_classes=10, embed_dims=256 // args.width_div,
                                      num_heads=8, depths=4, rngs=nnx.Rngs(0))
                shape = (args.T, batch, 32, 32, 3)
            tx = optax.adam(1e-3)
            for name in args.schedules:
                virtual = 2 if name == "interleaved" else 1
                mesh = mesh_lib.make_mesh(f"stage={stages}", jax.devices()[:stages])
                remat.configure(model, remat="none", spike_residuals=args.spike_residuals)
                plan = parallel.plan(model, mesh, mode="pp", global_batch_size=batch,
                                     pipeline=PipelineOptions(name, virtual, m), input_shape=shape)
                for policy in args.remat:  # the layout planned without checkpointing, for every policy
                    remat.configure(model, remat=policy, spike_residuals=args.spike_residuals)
                    graphdef, params, rngs, rest = split_model(model)
                    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                                       opt_state=tx.init(params))
                    cfg = StepConfig(seed=0, time_steps=args.T, encoder=None)
                    state, step = apply_plan(plan, state, cfg, graphdef, tx, donate=False)
                    x = (jax.random.uniform(jax.random.key(1), shape) < 0.3).astype(jnp.float32)
                    b = {"inputs": jax.device_put(x, plan.batch_sharding(5, 1)),
                         "labels": jax.device_put(jnp.arange(batch) % 10, plan.batch_sharding(1, 0))}
                    w_counts = w_contractions(step.trace(state, b).jaxpr, len(plan.pipeline.layout))
                    t0 = time.perf_counter()
                    compiled = step.lower(state, b).compile()
                    compile_ms = (time.perf_counter() - t0) * 1e3
                    mem = compiled.memory_analysis()
                    times = []
                    if args.steps:
                        jax.block_until_ready(compiled(state, b))
                        for _ in range(args.steps):
                            t0 = time.perf_counter()
                            jax.block_until_ready(compiled(state, b))
                            times.append((time.perf_counter() - t0) * 1e3)
                    s = plan.pipeline_summary
                    record = {
                        "benchmark": "pipeline", "model": args.model, "width_div": args.width_div, "T": args.T,
                        "schedule": name, "stages": stages, "virtual_stages": virtual, "microbatches": m,
                        "microbatch_size": args.microbatch_size, "spike_residuals": args.spike_residuals,
                        "remat": policy, "global_batch_size": batch,
                        "layout": s["layout"], "bubble_fraction": s["bubble_fraction"], "ticks": s["ticks"],
                        "stage_inputs_held": s["stage_inputs_held"],
                        "activation_bytes_per_device": int(mem.temp_size_in_bytes),
                        "argument_bytes_per_device": int(mem.argument_size_in_bytes),
                        "peak_bytes_per_device": peak_bytes(compiled)[0],
                        "w_contractions_per_stage": w_counts,
                        "compile_ms": round(compile_ms, 1),
                        "step_ms_median": round(statistics.median(times), 2) if times else None,
                        "device": jax.devices()[0].device_kind, "device_count": stages, "jax": jax.__version__,
                        "git_commit": git_commit(), "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    }
                    print(f"{args.model} {name:<12} S={stages} M={m:<3} batch={batch:<4} remat={policy:<13} bubble "
                          f"{s['bubble_fraction']:6.1%}  stage inputs held {s['stage_inputs_held']:<3} activations "
                          f"{mem.temp_size_in_bytes / 2**20:9.2f} MiB/device, peak "
                          f"{record['peak_bytes_per_device'] / 2**20:.2f} MiB"
                          + (f", W contractions per stage {w_counts}" if w_counts else "")
                          + (f"  {record['step_ms_median']:.1f} ms/step" if times else ""), flush=True)
                    append_jsonl(args.out, record)


def w_contractions(jaxpr, num_stages: int) -> list[int] | None:
    """The contractions (``dot_general``, ``conv_general_dilated``) in each stage's W action of a traced zero-bubble
    step: the last ``num_stages`` branches of the tick's ``lax.switch`` (idle, then F, B and W per stage), counted
    through nested jaxprs. None when the step has no such switch (other schedules)."""
    from jax.extend import core

    def count(j) -> int:
        return sum(e.primitive.name in ("dot_general", "conv_general_dilated") for e in j.eqns) + sum(
            count(sub) for e in j.eqns for sub in core.jaxprs_in_params(e.params))

    def find(j):
        for e in j.eqns:
            branches = e.params.get("branches", ())
            if e.primitive.name == "cond" and len(branches) == 1 + 3 * num_stages:
                return [count(b.jaxpr) for b in branches[-num_stages:]]
            for sub in core.jaxprs_in_params(e.params):
                found = find(sub)
                if found is not None:
                    return found
        return None

    return find(jaxpr.jaxpr if hasattr(jaxpr, "jaxpr") else jaxpr)


if __name__ == "__main__":
    main()
