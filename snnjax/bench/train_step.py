"""Whole-training-step benchmark: snnjax's jitted train step against SpikingJelly's, same model and shapes.

    python -m snnjax.bench.train_step --model {cifar10dvs_vgg,spikformer_ti,mlp,sdt,qkformer,sew_resnet18,
        spiking_resnet18,dvsgesture_plif,ms_resnet18} --batch-size N --T T
        [--grad-accum K] [--steps S] [--warmup W] [--conv auto|xla]
        [--compare-spikingjelly] [--sj-python PATH] [--out FILE.jsonl]

Models at full size (``snnjax.bench.workload``), float32, synthetic data, Adam (lr 1e-3), cross-entropy of
the time-mean logits:
- ``cifar10dvs_vgg``: SpikingJelly's CIFAR10DVSVGG widths, event frames ``[T, N, 48, 48, 2]``;
- ``spikformer_ti``: 256 dims, depth 4, 8 heads, 10 classes, a static ``32 x 32 x 3`` image repeated T times;
- ``mlp``: the spiking MLP 64 -> 256 -> 10 on 8 x 8 digits-like inputs ``[T, N, 64]``;
- ``sdt``, ``qkformer``: SpikingJelly's ``sdt_8_384`` and ``qkformer_10_384``, 10 classes, a static
  ``32 x 32 x 3`` image repeated T times.
- ``sew_resnet18`` (cnf ADD, PLIF) on event frames ``[T, N, 64, 64, 2]``, ``spiking_resnet18`` (IF) on a static
  ``32 x 32 x 3`` image, ``dvsgesture_plif`` (DVSGestureNet, PLIF) on event frames ``[T, N, 128, 128, 2]``,
  ``ms_resnet18`` (SpikingJelly's defaults: LIF tau 4/3, Rect surrogate) on a static ``32 x 32 x 3`` image.

It times ``snnjax.train.step.train_step`` jitted with the state donated (with ``--grad-accum`` 1 it
has no loop around the model; above, its microbatch ``lax.scan`` is included). ``--conv xla`` swaps
the CPU convolution (``snnjax.layers.conv_cpu``) for ``lax.conv_general_dilated`` to measure what it
gains. Reported: compile seconds (lower + compile) and the median / min milliseconds of ``--steps``
steps after ``--warmup``, each ended by ``block_until_ready``.
``--compare-spikingjelly`` runs SpikingJelly's own model (``snnjax.bench.spikingjelly_train_step``,
multi-step mode, ``torch.optim.Adam``, one device) in a process of ``--sj-python`` kept alive beside ours
(``snnjax.bench.peer``): the two sides' steps alternate repetition by repetition. Its neuron backends: torch
on a CPU; cupy and torch on a GPU, the fastest compared. torch gets ``--sj-threads`` threads (default: the
cores XLA's CPU pool uses); the record carries both sides' thread counts, torch's and SpikingJelly's
versions, the backend, and the ratio SpikingJelly ms / ours (above 1: we are faster). ``--out`` appends one
JSON line.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

from snnjax.bench.common import (
    append_jsonl,
    default_sj_backends,
    git_commit,
    spikingjelly_fields,
    start_spikingjelly_steps,
)
from snnjax.bench.peer import interleave, thread_info, timed_ms
from snnjax.bench.workload import MODELS, architecture, input_shape, make_batch

__all__ = ["MODELS", "build_model", "input_shape", "make_batch", "make_step", "time_ours"]


def build_model(model: str, t: int, rngs, *, dtype=None, param_dtype=None, width_div: int = 1,
                image_size: int | None = None, **overrides):
    """The snnjax model of ``workload.architecture`` (``width_div`` 1: full size; ``overrides`` replace any
    constructor argument); ``dtype`` / ``param_dtype`` as in ``create_model`` (None: float32)."""
    from snnjax.models.registry import create_model

    kwargs = architecture(model, t, width_div, image_size)
    name = {"spikformer_ti": "spikformer", "dvsgesture_plif": "dvsgesture_net"}.get(model, model)
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


def prepare_ours(model: str, batch: int, t: int, grad_accum: int, warmup: int, conv: str = "auto",
                 **overrides) -> tuple:
    """``(one_step, info)``: ``one_step()`` runs our compiled step once (blocking) on the benchmark batch, after
    ``warmup`` untimed steps; ``info`` has the compile seconds, the first loss and the parameter count."""
    import jax

    step, state = make_step(model, t, grad_accum, conv, **overrides)
    x, y = make_batch(model, batch, t)
    data = {"inputs": jax.numpy.asarray(x), "labels": jax.numpy.asarray(y)}
    start = time.perf_counter()
    compiled = step.lower(state, data).compile()
    info = {"compile_s": time.perf_counter() - start,
            "num_params": int(sum(p.size for p in jax.tree.leaves(state.params)))}
    holder = {"state": state}

    def one_step():
        holder["state"], metrics = jax.block_until_ready(compiled(holder["state"], data))
        return metrics

    info["loss"] = float(one_step()["loss"])
    for _ in range(max(warmup - 1, 0)):
        one_step()
    return one_step, info


def time_ours(model: str, batch: int, t: int, grad_accum: int, steps: int, warmup: int, conv: str = "auto",
              **overrides) -> dict:
    """Compile seconds, per-step milliseconds and the first loss of our step alone."""
    one_step, info = prepare_ours(model, batch, t, grad_accum, warmup, conv, **overrides)
    times = [timed_ms(one_step) for _ in range(steps)]
    return {"median_ms": statistics.median(times), "min_ms": min(times), **info}


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
    p.add_argument("--sj-threads", type=int, default=thread_info()["schedulable_cores"],
                   help="torch.set_num_threads for SpikingJelly (default: the cores XLA's CPU pool uses)")
    p.add_argument("--sj-backends", nargs="+", choices=["torch", "cupy"],
                   help="SpikingJelly neuron backends (default: torch on a CPU, cupy and torch on a GPU)")
    p.add_argument("--out", help="append one JSON line to this file")
    args = p.parse_args(argv)

    from snnjax import hostmem

    hostmem.keep_freed_memory()
    import jax

    device = jax.devices()[0]
    load = os.getloadavg()[0]
    one_step, info = prepare_ours(args.model, args.batch_size, args.T, args.grad_accum, args.warmup, args.conv)
    timers, peers, errors = {"ours": lambda: timed_ms(one_step)}, {}, {}
    if args.compare_spikingjelly:
        peers, errors = start_spikingjelly_steps(
            args.sj_python, args.sj_backends or default_sj_backends(device.platform), model=args.model,
            batch=args.batch_size, t=args.T, threads=args.sj_threads, warmup=args.warmup, platform=device.platform)
        timers.update({f"sj:{b}": peer.time_once for b, peer in peers.items()})
    try:
        times = interleave(timers, args.steps)
    finally:
        for peer in peers.values():
            peer.close()
    ours = {"median_ms": statistics.median(times["ours"]), "min_ms": min(times["ours"]), **info}
    rec = {"bench": "train_step", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device_kind": device.device_kind,
           "platform": device.platform, "model": args.model, "input_shape": [args.T, args.batch_size,
                                                                            *input_shape(args.model)],
           "T": args.T, "batch": args.batch_size, "grad_accum": args.grad_accum, "dtype": "float32",
           "step": "train_step", "conv": args.conv, "optimizer": "adam", **ours, "steps": args.steps,
           "warmup": args.warmup, "threads": thread_info(), "load_avg": load, "jax_version": jax.__version__,
           "git_commit": git_commit()}
    line = (f"{args.model} N={args.batch_size} T={args.T} accum={args.grad_accum} conv={args.conv}: "
            f"ours {ours['median_ms']:.1f} ms (min {ours['min_ms']:.1f}, compile {ours['compile_s']:.1f} s)")
    if args.compare_spikingjelly:
        rec.update(spikingjelly_fields(peers, times, ours["median_ms"], args.batch_size, errors))
        line += "; " + sj_summary(rec)
    rec["load_avg_end"] = os.getloadavg()[0]
    print(line + f"; load {rec['load_avg']:.1f}-{rec['load_avg_end']:.1f}", flush=True)
    append_jsonl(args.out, rec)
    return rec


def sj_summary(rec: dict) -> str:
    """The SpikingJelly comparison of a record in words."""
    if "spikingjelly_ms" not in rec:
        return f"SpikingJelly unavailable ({rec['spikingjelly_error']})"
    return (f"SpikingJelly ({rec['spikingjelly_backend']} backend, torch {rec['torch_version']}, "
            f"{rec['torch_threads']} threads, 1 device) {rec['spikingjelly_ms']:.1f} ms "
            f"(min {rec['spikingjelly_min_ms']:.1f}), interleaved; ratio SJ/ours "
            f"{rec['ratio_spikingjelly_over_ours']:.2f}x")


if __name__ == "__main__":
    main()
