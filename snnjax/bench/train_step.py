"""Whole-training-step benchmark: snnjax's jitted train step against SpikingJelly's, same model and shapes.

    python -m snnjax.bench.train_step --model {cifar10dvs_vgg,spikformer_ti,mlp} --batch-size N --T T
        [--grad-accum K] [--steps S] [--warmup W] [--conv auto|xla]
        [--compare-spikingjelly] [--sj-python PATH] [--out FILE.jsonl]

Models at full size, float32, synthetic data, Adam (lr 1e-3), cross-entropy of the time-mean logits:
- ``cifar10dvs_vgg``: SpikingJelly's CIFAR10DVSVGG widths, event frames ``[T, N, 48, 48, 2]``;
- ``spikformer_ti``: 256 dims, depth 4, 8 heads, 10 classes, a static ``32 x 32 x 3`` image repeated T times;
- ``mlp``: the spiking MLP 64 -> 256 -> 10 on 8 x 8 digits-like inputs ``[T, N, 64]``.

It times ``snnjax.train.step.train_step`` jitted with the state donated (with ``--grad-accum`` 1 it
has no loop around the model; above, its microbatch ``lax.scan`` is included). ``--conv xla`` swaps
the CPU convolution (``snnjax.layers.conv_cpu``) for ``lax.conv_general_dilated`` to measure what it
gains. Reported: compile seconds (lower + compile) and the median / min milliseconds of ``--steps``
steps after ``--warmup``, each ended by ``block_until_ready``.
``--compare-spikingjelly`` runs SpikingJelly's own model (``snnjax.bench.spikingjelly_train_step``,
torch CPU, 2 threads, multi-step mode, neuron backend ``torch``) with ``torch.optim.Adam`` in a
subprocess of ``--sj-python`` right after, and prints the ratio SpikingJelly ms / ours (above 1: we are
faster). ``--out`` appends one JSON line.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from snnjax.bench.common import append_jsonl, git_commit

MODELS = ("cifar10dvs_vgg", "spikformer_ti", "mlp")


def input_shape(model: str, image_size: int | None = None) -> tuple[int, ...]:
    """Per-example, per-time-step input shape (channels-last); ``image_size`` replaces the frames' side."""
    shape = {"cifar10dvs_vgg": (48, 48, 2), "spikformer_ti": (32, 32, 3), "mlp": (64,)}[model]
    return shape if image_size is None or model == "mlp" else (image_size, image_size, shape[-1])


def make_batch(model: str, batch: int, t: int, seed: int = 0,
               image_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs [T, N, ...] float32, labels [N] int32)``: event counts for the VGG, N(0, 1) images otherwise."""
    rng = np.random.default_rng(seed)
    shape = (t, batch, *input_shape(model, image_size))
    if model == "cifar10dvs_vgg":
        x = (rng.random(shape) < 0.3) * rng.integers(1, 4, shape)
    elif model == "spikformer_ti":
        x = np.broadcast_to(rng.standard_normal((1, *shape[1:])), shape)
    else:
        x = rng.random(shape) * 2.0
    return np.ascontiguousarray(x, np.float32), rng.integers(0, 10, batch).astype(np.int32)


def build_model(model: str, t: int, rngs, *, dtype=None, param_dtype=None, **overrides):
    """The snnjax model at full size (``overrides`` shrink it for tests); ``dtype`` / ``param_dtype`` as in
    ``create_model`` (None: the layers' defaults, float32)."""
    from snnjax.models.registry import create_model

    kwargs = {
        "cifar10dvs_vgg": dict(),
        "spikformer_ti": dict(embed_dims=256, num_heads=8, depths=4, mlp_ratio=4.0, img_size=32, in_channels=3,
                              num_classes=10, T=t),
        "mlp": dict(in_features=64, hidden=(256,), num_classes=10),
    }[model]
    name = {"spikformer_ti": "spikformer"}.get(model, model)
    return create_model(name, {**kwargs, **overrides}, rngs=rngs, dtype=dtype, param_dtype=param_dtype)


def make_step(model: str, t: int, grad_accum: int, conv: str = "auto", **overrides):
    """``(step, state)``: ``step(state, batch) -> (state, metrics)``, the jitted train step with the state donated.

    ``conv="xla"`` makes every ``Conv2d`` call ``lax.conv_general_dilated`` (XLA's own gradients) instead of
    the layer's default (``snnjax.layers.conv_cpu`` on a CPU).
    """
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from snnjax.layers.conv import Conv2d
    from snnjax.layers.conv_cpu import compiler_options
    from snnjax.train import step as S

    net = build_model(model, t, nnx.Rngs(params=0, dropout=1), **overrides)
    if conv == "xla":
        for _, module in nnx.iter_graph(net):
            if isinstance(module, Conv2d):
                module.conv_general_dilated = jax.lax.conv_general_dilated
    graphdef, params, rngs, rest = S.split_model(net)
    tx = optax.adam(1e-3)
    state = S.TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                         opt_state=tx.init(params))
    cfg = S.StepConfig(seed=0, time_steps=t, encoder=None, grad_accum_steps=grad_accum)
    return jax.jit(functools.partial(S.train_step, cfg, graphdef, tx), donate_argnums=0,
                   compiler_options=compiler_options()), state


def time_ours(model: str, batch: int, t: int, grad_accum: int, steps: int, warmup: int, conv: str = "auto",
              **overrides) -> dict:
    """Compile seconds, per-step milliseconds and the first loss of our step."""
    import jax

    step, state = make_step(model, t, grad_accum, conv, **overrides)
    x, y = make_batch(model, batch, t)
    data = {"inputs": jax.numpy.asarray(x), "labels": jax.numpy.asarray(y)}
    start = time.perf_counter()
    compiled = step.lower(state, data).compile()
    compile_s = time.perf_counter() - start
    state, metrics = compiled(state, data)
    loss = float(metrics["loss"])
    for _ in range(max(warmup - 1, 0)):
        state, metrics = jax.block_until_ready(compiled(state, data))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, metrics = jax.block_until_ready(compiled(state, data))
        times.append((time.perf_counter() - start) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "compile_s": compile_s, "loss": loss,
            "num_params": int(sum(p.size for p in jax.tree.leaves(state.params)))}


def run_spikingjelly(python: str, model: str, batch: int, t: int, steps: int, warmup: int, threads: int) -> dict:
    """SpikingJelly's timings (``snnjax.bench.spikingjelly_train_step`` run by ``python``), or ``{"error": ...}``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "batch.npz")
        x, y = make_batch(model, batch, t)
        np.savez(path, inputs=x, labels=y)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spikingjelly_train_step.py")
        cmd = [python, script, "--model", model, "--batch", path, "--T", str(t), "--steps", str(steps),
               "--warmup", str(warmup), "--threads", str(threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=MODELS)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--T", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
    p.add_argument("--conv", default="auto", choices=["auto", "xla"],
                   help="auto: Conv2d's default (snnjax.layers.conv_cpu on a CPU); xla: lax.conv_general_dilated")
    p.add_argument("--compare-spikingjelly", action="store_true")
    p.add_argument("--sj-python", default=sys.executable, help="Python with torch and spikingjelly")
    p.add_argument("--sj-threads", type=int, default=2, help="torch.set_num_threads for SpikingJelly")
    p.add_argument("--out", help="append one JSON line to this file")
    args = p.parse_args(argv)

    from snnjax import hostmem

    hostmem.keep_freed_memory()
    import jax

    ours = time_ours(args.model, args.batch_size, args.T, args.grad_accum, args.steps, args.warmup, args.conv)
    device = jax.devices()[0]
    rec = {"bench": "train_step", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device_kind": device.device_kind,
           "platform": device.platform, "model": args.model, "input_shape": [args.T, args.batch_size,
                                                                            *input_shape(args.model)],
           "T": args.T, "batch": args.batch_size, "grad_accum": args.grad_accum, "dtype": "float32",
           "step": "train_step", "conv": args.conv, "optimizer": "adam", **ours, "steps": args.steps,
           "warmup": args.warmup,
           "load_avg": os.getloadavg()[0], "jax_version": jax.__version__, "git_commit": git_commit()}
    line = (f"{args.model} N={args.batch_size} T={args.T} accum={args.grad_accum} conv={args.conv}: "
            f"ours {ours['median_ms']:.1f} ms (min {ours['min_ms']:.1f}, compile {ours['compile_s']:.1f} s)")
    if args.compare_spikingjelly:
        sj = run_spikingjelly(args.sj_python, args.model, args.batch_size, args.T, args.steps, args.warmup,
                              args.sj_threads)
        if "error" in sj:
            rec["spikingjelly_error"] = sj["error"]
            line += f"; SpikingJelly unavailable ({sj['error']})"
        else:
            rec.update(spikingjelly_ms=sj["median_ms"], spikingjelly_min_ms=sj["min_ms"],
                       spikingjelly_loss=sj["loss"], spikingjelly_num_params=sj["num_params"],
                       torch_version=sj["torch"], torch_threads=sj["threads"],
                       ratio_spikingjelly_over_ours=sj["median_ms"] / ours["median_ms"])
            line += (f"; SpikingJelly {sj['median_ms']:.1f} ms (min {sj['min_ms']:.1f}); "
                     f"ratio SJ/ours {sj['median_ms'] / ours['median_ms']:.2f}x")
    rec["load_avg_end"] = os.getloadavg()[0]
    print(line + f"; load {rec['load_avg']:.1f}-{rec['load_avg_end']:.1f}", flush=True)
    append_jsonl(args.out, rec)
    return rec


if __name__ == "__main__":
    main()
