"""Plain ``jax.jit`` of the library's train step against the same jitted with ``conv_cpu.compiler_options``.

    python -m snnjax.bench.plain_jit [--model cifar10dvs_vgg] [--batch-size 8] [--T 4] [--reps 10] [--out F.jsonl]

``import snnjax`` makes the library's CPU convolution setting XLA's default (``snnjax.xla_options``), so
the two should take the same time; run with ``XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=...`` set
by hand to see a process where the user's setting won. Both steps are compiled in one process and timed
alternately, repetition by repetition (the machine's load changes both alike); reported: each side's
median and min milliseconds, their ratio, whether the two compiled programs are the same (``as_text``),
whether the default was set, and ``XLA_FLAGS``.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics

from snnjax.bench.common import append_jsonl, git_commit
from snnjax.bench.peer import timed_ms
from snnjax.bench.workload import MODELS, make_batch


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cifar10dvs_vgg", choices=MODELS)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--T", type=int, default=4)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    import snnjax
    from snnjax.bench.train_step import build_model
    from snnjax.layers.conv_cpu import compiler_options
    from snnjax.train import step as S

    net = build_model(args.model, args.T, nnx.Rngs(params=0, dropout=1))
    graphdef, params, rngs, rest = S.split_model(net)
    tx = optax.adam(1e-3)
    state = S.TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                         opt_state=tx.init(params))
    cfg = S.StepConfig(seed=0, time_steps=args.T, encoder=None)
    fn = functools.partial(S.train_step, cfg, graphdef, tx)
    x, y = make_batch(args.model, args.batch_size, args.T)
    batch = {"inputs": jnp.asarray(x), "labels": jnp.asarray(y)}
    steps = {"plain_jit": jax.jit(fn).lower(state, batch).compile(),
             "with_options": jax.jit(fn, compiler_options=compiler_options()).lower(state, batch).compile()}
    times: dict[str, list[float]] = {k: [] for k in steps}
    for rep in range(args.warmup + args.reps):
        for name, compiled in steps.items():
            ms = timed_ms(lambda c=compiled: jax.block_until_ready(c(state, batch)))
            if rep >= args.warmup:
                times[name].append(ms)
    rec = {"bench": "plain_jit", "model": args.model, "batch_size": args.batch_size, "T": args.T, "reps": args.reps,
           "timing": "interleaved", "cpu_conv_default_set": snnjax.CPU_CONV_DEFAULT,
           "xla_flags": os.environ.get("XLA_FLAGS", ""), "device": jax.devices()[0].device_kind,
           "same_program": steps["plain_jit"].as_text() == steps["with_options"].as_text(),
           "commit": git_commit()}
    for name, ts in times.items():
        rec[f"{name}_median_ms"], rec[f"{name}_min_ms"] = statistics.median(ts), min(ts)
    rec["plain_over_options"] = rec["plain_jit_median_ms"] / rec["with_options_median_ms"]
    print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()), flush=True)
    if args.out:
        append_jsonl(args.out, rec)
    return rec


if __name__ == "__main__":
    main()
