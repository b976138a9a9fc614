"""Tuning sweep of the fused kernels: forward-only and backward-only timings over ``KernelOptions``.

    python -m snnjax.bench.pallas_sweep [--ts 8 32] [--dtype float32] [--out FILE.jsonl]

LIF (SpikingJelly defaults) over ``[T, M]`` (M = 64 * 65536 by default): each forward option set (block,
warps, time chunk) and each backward one (block, warps, time chunk) is compiled, checked
to produce the same spikes / dX as the first, and timed (median over repetitions of 5
back-to-back calls). GB/s counts the kernel's own minimum traffic: X read and S written
(forward); X and dS read and dX written (backward). Prints the best per (part, T), and
a ``pallas:...`` impl spec for ``snnjax.bench.neuron`` that minimises the summed
forward + backward time over all T. Needs a GPU (on a CPU the kernels only interpret).
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from snnjax.neurons import base as B
from snnjax.neurons.kernels import pallas as P
from snnjax.neurons.kernels.pallas.backward import backward
from snnjax.neurons.kernels.pallas.forward import forward

FORWARD = {"block_m": [512, 1024, 2048], "num_warps": [8], "time_chunk": [4, 8, 16, 32]}
BACKWARD = {"block_m_backward": [256, 512], "num_warps_backward": [4], "time_chunk": [4, 8, 16]}


def _median_ms(fn, *args, reps: int = 30, inner: int = 5) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(inner):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / inner * 1e3)
    return statistics.median(times)


def _grid(space: dict):
    keys = list(space)
    for values in itertools.product(*(space[k] for k in keys)):
        yield dict(zip(keys, values, strict=True))


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ts", type=int, nargs="+", default=[8, 32])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--neurons", type=int, default=64 * 65536, help="M (default 64 * 65536)")
    p.add_argument("--out", help="append one JSON line per timed option set")
    args = p.parse_args(argv)
    cfg, dtype, m = B.NeuronConfig(kind="LIF", tau=2.0), jnp.dtype(args.dtype), args.neurons
    device = jax.devices()[0]
    records = []
    for t in args.ts:
        rng = np.random.default_rng(t)
        x = jnp.asarray(0.5 + rng.standard_normal((t, m), dtype=np.float32), dtype)
        ds = jnp.asarray(rng.standard_normal((t, m), dtype=np.float32), dtype)
        v0 = jnp.zeros((), jnp.float32)  # the default state: one start shared by every neuron
        first = {}
        for part, space in (("forward", FORWARD), ("backward", BACKWARD)):
            for kw in _grid(space):
                opts = P.KernelOptions(**kw)
                if part == "forward":
                    fn = jax.jit(lambda x, v0, o=opts: forward(cfg, False, o, x, v0, None, checkpoints=True))
                    fn_args, passes = (x, v0), 2
                else:
                    ck = jax.jit(lambda x, v0, o=opts: forward(cfg, False, o, x, v0, None, checkpoints=True)[2])(x, v0)
                    fn = jax.jit(lambda x, ck, ds, o=opts, v0=v0: backward(cfg, False, o, x, ck, v0, None, ds, None))
                    fn_args, passes = (x, ck, ds), 3
                out = fn(*fn_args)[0]
                same = bool(jnp.array_equal(out, first.setdefault(part, out)))
                ms = _median_ms(fn, *fn_args)
                rec = {"bench": "pallas_sweep", "device_kind": device.device_kind, "part": part, "T": t, "M": m,
                       "dtype": dtype.name, **kw, "ms": ms, "gb_per_s": passes * dtype.itemsize * t * m / ms / 1e6,
                       "same_result": same, "jax_version": jax.__version__}
                records.append(rec)
                print(json.dumps(rec), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
    for part, space in (("forward", FORWARD), ("backward", BACKWARD)):
        for t in args.ts:
            top = min((r for r in records if r["part"] == part and r["T"] == t), key=lambda r: r["ms"])
            print(f"best {part} T={t}: {top['ms']:.3f} ms, {top['gb_per_s']:.0f} GB/s, "
                  + ", ".join(f"{k}={top[k]}" for k in space))
    # One spec: the time chunk is shared by both kernels, so pick it (and the rest) on the summed time.
    total = {}
    for fw, bw in itertools.product(_grid(FORWARD), _grid(BACKWARD)):
        if fw["time_chunk"] != bw["time_chunk"]:
            continue
        ms = 0.0
        for part, kw in (("forward", fw), ("backward", bw)):
            ms += sum(r["ms"] for r in records if r["part"] == part and all(r[k] == v for k, v in kw.items()))
        total[json.dumps({**fw, **bw}, sort_keys=True)] = ms
    best = json.loads(min(total, key=total.get))
    spec = "pallas:" + ",".join(f"{k}={v}" for k, v in best.items())
    print(f"best spec (summed over T): {spec}")
    return spec


if __name__ == "__main__":
    main()
