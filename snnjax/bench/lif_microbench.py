"""LIF forward + backward micro-benchmark: custom-vjp ``multistep`` vs autodiff ``multistep_reference``.

Times ``grad_x sum(spikes * cotangent)`` of a LIF neuron (tau=2, Sigmoid(4),
hard reset to 0, SpikingJelly defaults) over ``[T, N, F]`` float32 inputs, for
each T, on the default JAX backend. Both implementations are jitted, compiled
and warmed up, checked to agree, then timed in interleaved repetitions (the
order alternates every repetition, since machines are noisy) with
``block_until_ready``; the table reports the median milliseconds.

    python -m snnjax.bench.lif_microbench [--out FILE.jsonl] [--ts 4 8 16] [--reps 15]

With ``--out`` one JSON line per (impl, T) is appended: bench, device kind,
platform, impl, T, shape, dtype, median_ms, min_ms, reps, jax version, time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from snnjax.neurons import functional as F

IMPLS = {"custom_vjp": F.multistep, "autodiff": F.multistep_reference}


def make_grad_fn(impl: str, cfg: F.NeuronConfig):
    """Jitted ``(x, ct) -> d/dx sum(spikes * ct)`` for one implementation."""
    fn = IMPLS[impl]

    def loss(x, ct):
        spikes, _ = fn(cfg, x)
        return jnp.sum(spikes * ct)

    return jax.jit(jax.grad(loss))


def bench_t(t: int, batch: int, features: int, reps: int, warmup: int, cfg: F.NeuronConfig,
            dtype=jnp.float32) -> dict[str, list[float]]:
    """Per-repetition milliseconds of each implementation at one T."""
    kx, kc = jax.random.split(jax.random.key(t))
    shape = (t, batch, features)
    x = (0.5 + jax.random.normal(kx, shape)).astype(dtype)
    ct = jax.random.normal(kc, shape).astype(dtype)
    fns = {name: make_grad_fn(name, cfg) for name in IMPLS}
    grads = {}
    for name, fn in fns.items():
        for _ in range(max(warmup, 1)):
            grads[name] = jax.block_until_ready(fn(x, ct))
    ref = np.asarray(grads["autodiff"], np.float64)
    err = np.linalg.norm(np.asarray(grads["custom_vjp"], np.float64) - ref) / max(np.linalg.norm(ref), 1e-30)
    if not err < 1e-4:
        raise RuntimeError(f"T={t}: custom_vjp and autodiff gradients differ (relative error {err:.2e})")

    times = {name: [] for name in fns}
    order = list(fns)
    for r in range(reps):
        for name in (order if r % 2 == 0 else order[::-1]):
            start = time.perf_counter()
            jax.block_until_ready(fns[name](x, ct))
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="append one JSON line per (impl, T) to this file")
    p.add_argument("--ts", type=int, nargs="+", default=[4, 8, 16], help="time steps (default 4 8 16)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--features", type=int, default=16384)
    p.add_argument("--reps", type=int, default=15, help="timed repetitions per impl and T")
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)

    cfg = F.NeuronConfig(kind="LIF", tau=2.0)
    device = jax.devices()[0]
    dtype = jnp.float32
    records = []
    print(f"LIF fwd+bwd, [T, {args.batch}, {args.features}] {jnp.dtype(dtype).name}, "
          f"{device.platform} ({device.device_kind}), median of {args.reps} interleaved reps")
    print(f"{'T':>4} {'custom_vjp ms':>14} {'autodiff ms':>12} {'speedup':>8}")
    for t in args.ts:
        times = bench_t(t, args.batch, args.features, args.reps, args.warmup, cfg, dtype)
        med = {name: statistics.median(v) for name, v in times.items()}
        print(f"{t:>4} {med['custom_vjp']:>14.1f} {med['autodiff']:>12.1f} "
              f"{med['autodiff'] / med['custom_vjp']:>7.2f}x", flush=True)
        for name, v in times.items():
            records.append({
                "bench": "lif_microbench", "device_kind": device.device_kind, "platform": device.platform,
                "impl": name, "T": t, "shape": [t, args.batch, args.features], "dtype": jnp.dtype(dtype).name,
                "median_ms": med[name], "min_ms": min(v), "reps": len(v),
                "jax_version": jax.__version__, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            })
    if args.out:
        with open(args.out, "a") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
    return records


if __name__ == "__main__":
    main()
