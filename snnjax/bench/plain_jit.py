"""Plain ``jax.jit`` of the library's train step against the same jitted with the library's XLA options.

    python -m snnjax.bench.plain_jit [--model cifar10dvs_vgg] [--dtype float32|float64] [--batch-size 8] [--T 4]
        [--image-size P] [--reps 10] [--warmup 2] [--out F.jsonl]

Three compiles of one step (``snnjax.train.step.train_step``, Adam) in one process:
- ``plain_jit``: ``jax.jit(step)``, XLA's default (what model code a user jits gets: ``import snnjax`` sets nothing);
- ``library``: ``jax.jit(step, compiler_options=conv_cpu.compiler_options(state))``, the library's choice for the
  step's dtype (on the CPU: convolutions on Eigen for float32, XLA's default for float64);
- ``eigen``: ``compiler_options=conv_cpu.CPU_CONV_OPTIONS`` whatever the dtype (what every compile got while
  ``import snnjax`` set it in ``XLA_FLAGS``).
Compiles that give the same program (``as_text``) are timed once; the distinct ones alternately, repetition by
repetition (the machine's load changes them alike). Reported: each compile's median and min milliseconds and its
median CPU milliseconds (the process's, all threads: steadier than wall time on a shared machine), which compiles
share a program, ``plain_over_library``, ``eigen_over_library`` (medians) and ``XLA_FLAGS``.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

from snnjax.bench.common import append_jsonl, git_commit
from snnjax.bench.peer import timed_ms
from snnjax.bench.workload import MODELS, make_batch


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cifar10dvs_vgg", choices=MODELS)
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--T", type=int, default=4)
    p.add_argument("--image-size", type=int, default=None, help="the image models' side (default: the workload's)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import jax

    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from snnjax.bench.train_step import build_model
    from snnjax.layers.conv_cpu import CPU_CONV_OPTIONS, compiler_options
    from snnjax.train import step as S

    dtype = jnp.dtype(args.dtype)
    net = build_model(args.model, args.T, nnx.Rngs(params=0, dropout=1), dtype=dtype, param_dtype=dtype,
                      image_size=args.image_size)
    graphdef, params, rngs, rest = S.split_model(net)
    tx = optax.adam(1e-3)
    state = S.TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                         opt_state=tx.init(params))
    cfg = S.StepConfig(seed=0, time_steps=args.T, encoder=None)
    fn = functools.partial(S.train_step, cfg, graphdef, tx)
    x, y = make_batch(args.model, args.batch_size, args.T, image_size=args.image_size)
    batch = {"inputs": jnp.asarray(x, dtype), "labels": jnp.asarray(y)}
    options = {"plain_jit": None, "library": compiler_options(state), "eigen": dict(CPU_CONV_OPTIONS)}
    compiled = {name: jax.jit(fn, compiler_options=o).lower(state, batch).compile() for name, o in options.items()}
    programs: dict[str, list[str]] = {}  # program text -> the compiles that gave it
    for name, c in compiled.items():
        programs.setdefault(c.as_text(), []).append(name)
    times: dict[str, list[float]] = {names[0]: [] for names in programs.values()}
    cpu: dict[str, list[float]] = {name: [] for name in times}
    for rep in range(args.warmup + args.reps):
        for name in times:
            start = time.process_time()
            ms = timed_ms(lambda c=compiled[name]: jax.block_until_ready(c(state, batch)))
            if rep >= args.warmup:
                times[name].append(ms)
                cpu[name].append((time.process_time() - start) * 1e3)
    rec = {"bench": "plain_jit", "model": args.model, "dtype": args.dtype, "batch_size": args.batch_size, "T": args.T,
           "image_size": args.image_size, "reps": args.reps, "timing": "interleaved",
           "library_options": options["library"], "xla_flags": os.environ.get("XLA_FLAGS", ""),
           "device": jax.devices()[0].device_kind, "same_program": sorted(programs.values()),
           "load_average": os.getloadavg()[0], "commit": git_commit()}
    for names in programs.values():
        for name in names:
            rec[f"{name}_median_ms"] = statistics.median(times[names[0]])
            rec[f"{name}_min_ms"] = min(times[names[0]])
            rec[f"{name}_cpu_median_ms"] = statistics.median(cpu[names[0]])
    rec["plain_over_library"] = rec["plain_jit_median_ms"] / rec["library_median_ms"]
    rec["eigen_over_library"] = rec["eigen_median_ms"] / rec["library_median_ms"]
    print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()), flush=True)
    if args.out:
        append_jsonl(args.out, rec)
    return rec


if __name__ == "__main__":
    main()
