"""Times SpikingJelly's multi-step LIF (forward + backward) for ``snnjax.bench.neuron``; needs torch and spikingjelly.

    SJ_LIF_CUDA_IMPLEMENTATION=triton python -m snnjax.bench.spikingjelly_lif --device cuda --ts 4 8

Runs ``LIFNode(step_mode='m')`` with its defaults (tau 2, Sigmoid(4), hard reset to 0)
on the benchmark's inputs (``snnjax.bench.neuron.make_inputs``, so both sides see the
same numbers), computes the spikes and ``x.grad`` for the cotangent dS ``--inner`` times
per timed repetition (one device sync at its end), and prints one JSON line per T: median / min
milliseconds, the spike count and the gradient's L2 norm. On a GPU, SpikingJelly picks its CUDA implementation from the
environment variable ``SJ_LIF_CUDA_IMPLEMENTATION`` (auto, cuda, triton, torch); the
benchmark runs this module once per backend. Kept free of JAX, so the two frameworks
never share a process or device memory pool.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from snnjax.bench.neuron import make_inputs


def run(functional, node, x, ds):
    """One training-shaped call: fresh state, spikes of ``x``, ``x.grad`` for the cotangent ``ds``."""
    functional.reset_net(node)
    x.grad = None
    spikes = node(x)
    spikes.backward(ds)
    return spikes


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="cpu", help="label for the records (cpu, triton, cuda, torch)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--ts", type=int, nargs="+", default=[4, 8, 16, 32])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--features", type=int, default=16384)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--inner", type=int, default=1, help="calls per timed repetition (one sync at its end)")
    p.add_argument("--keep-freed-memory", action="store_true", help="snnjax.hostmem.keep_freed_memory() first")
    args = p.parse_args(argv)
    if args.keep_freed_memory:
        from snnjax import hostmem

        hostmem.keep_freed_memory()

    import torch
    from spikingjelly.activation_based import functional, neuron

    dtype = getattr(torch, args.dtype)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    node = neuron.LIFNode(tau=2.0, step_mode="m")
    for t in args.ts:
        x_np, ds_np = make_inputs(t, args.batch, args.features)
        x = torch.from_numpy(x_np).to(dev, dtype).requires_grad_(True)
        ds = torch.from_numpy(ds_np).to(dev, dtype)
        del x_np, ds_np

        for _ in range(max(args.warmup, 1)):
            spikes = run(functional, node, x, ds)
        sync()
        summary = {"spikes": float(spikes.double().sum()), "dx_norm": float(x.grad.double().norm())}
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            for _ in range(args.inner):
                run(functional, node, x, ds)
            sync()
            times.append((time.perf_counter() - start) / args.inner * 1e3)
        print(json.dumps({"T": t, "backend": args.backend, "device": args.device, "median_ms": statistics.median(times),
                          "min_ms": min(times), "reps": len(times), "inner": args.inner, "torch": torch.__version__,
                          "implementation": os.environ.get("SJ_LIF_CUDA_IMPLEMENTATION", "auto"),
                          "keep_freed_memory": args.keep_freed_memory, **summary}),
              flush=True)
        del x, ds, spikes


if __name__ == "__main__":
    main()
