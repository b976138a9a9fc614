"""Per-device memory and collectives of a compiled train step under several layouts (compile only, no run).

    python -m snnjax.bench.parallel_memory [--model cifar10dvs_vgg] [--batch 16] [--time-steps 4] \
        [--layouts "dp:data=8 fsdp:fsdp=8 dp:data=4 dp_tp:data=4,tensor=2"] [--out FILE.jsonl]

One JSON line per layout: parameter / optimizer bytes per device (from the sharded
arrays), the compiled step's ``memory_analysis()`` (arguments, temporaries = activations
kept for the backward + gradients + workspace) and its collectives per step. Fakes 8 CPU
devices when no accelerator is present.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m snnjax.bench.parallel_memory")
    ap.add_argument("--model", default="cifar10dvs_vgg", choices=["cifar10dvs_vgg", "spikformer", "mlp"])
    ap.add_argument("--batch", type=int, default=16, help="global batch size")
    ap.add_argument("--time-steps", type=int, default=4)
    ap.add_argument("--layouts", default="dp:data=8 fsdp:fsdp=8 dp:data=4 dp_tp:data=4,tensor=2",
                    help="space-separated mode:mesh pairs (mode+sp: with sequence parallelism); a mesh over "
                         "fewer devices uses the first ones")
    ap.add_argument("--out", default=None, help="append the JSON lines to this file too")
    args = ap.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from snnjax import parallel
    from snnjax.models import create_model
    from snnjax.parallel import mesh as mesh_lib
    from snnjax.train import apply_plan
    from snnjax.train.step import StepConfig, TrainState, split_model

    kwargs = {"cifar10dvs_vgg": {},
              "spikformer": {"T": args.time_steps, "img_size_h": 128, "img_size_w": 128, "in_channels": 2},
              "mlp": {"in_features": 2 * 48 * 48}}[args.model]
    shape = (args.time_steps, args.batch, 128 if args.model == "spikformer" else 48,
             128 if args.model == "spikformer" else 48, 2)
    for item in args.layouts.split():
        mode, _, spec = item.partition(":")
        mode, sp = mode.removesuffix("+sp"), mode.endswith("+sp")
        model = create_model(args.model, kwargs, rngs=nnx.Rngs(0))
        graphdef, params, rngs, rest = split_model(model)
        tx = optax.adam(1e-3)
        state = TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                           opt_state=tx.init(params))
        sizes = mesh_lib.parse_mesh_spec(spec)
        n = 1
        for v in sizes.values():
            n *= v
        mesh = mesh_lib.make_mesh(spec, jax.devices()[:n])
        p = parallel.plan(model, mesh, mode=mode, sequence_parallel=sp)
        state, step = apply_plan(p, state, StepConfig(seed=0, time_steps=args.time_steps, encoder=None),
                                     graphdef, tx)
        batch = {"inputs": jax.ShapeDtypeStruct(shape, jnp.float32, sharding=p.batch_sharding(5, 1)),
                 "labels": jax.ShapeDtypeStruct((args.batch,), jnp.int32, sharding=p.batch_sharding(1, 0))}
        t0 = time.perf_counter()
        compiled = step.lower(state, batch).compile()
        report = parallel.step_report(compiled, state)
        record = {"model": args.model, "mode": mode, "sequence_parallel": sp, "mesh": spec, "devices": n,
                  "global_batch": args.batch, "time_steps": args.time_steps,
                  "num_params": int(sum(x.size for x in jax.tree.leaves(params))),
                  "compile_seconds": round(time.perf_counter() - t0, 1), **report}
        line = json.dumps(record)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")
        del state, compiled
    return 0


if __name__ == "__main__":
    sys.exit(main())
