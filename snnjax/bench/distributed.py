"""Distributed train-step benchmark: one parallel mode on one mesh, one JSONL record per run.

    python -m snnjax.bench.distributed --model {mlp,cifar10dvs_vgg,spikformer_ti} --mode MODE
        [--mesh data=2,tensor=4] [--prefer speed|memory] [--batch-size B] [--T T] [--steps S] [--warmup W]
        [--image-size P] [--dtype float32|bfloat16|float64] [--regime REGIME] [--no-phases]
        [--width-div K] [--devices N] [--compare-spikingjelly [--sj-python PATH] [--sj-threads N]]
        [--out FILE.jsonl]

The model (``snnjax.bench.train_step.build_model``: full size, or every hidden width divided by
``--width-div`` for layout studies on a CPU) trains with Adam on synthetic data
(``make_batch``) under ``snnjax.parallel.plan(model, mesh, mode=MODE, objective=--prefer)`` (its time:
``optimize_ms``), jitted by ``snnjax.train.apply_plan``. Without ``--mesh`` the mode's usual mesh over all
devices is used; a mesh must use every device. ``compile_ms`` is lower + compile; ``step_latency_ms`` is
the median of ``--steps`` steps after ``--warmup``, each ended by ``block_until_ready``.

Regimes: ``throughput_weak_scaling``: ``--batch-size`` is per data replica (the global batch is B times
data x fsdp); ``latency_strong_scaling`` (default): ``--batch-size`` is the global batch;
``memory_capacity``: as strong scaling, with the compiled memory per device printed.

Phases (unless ``--no-phases``): the forward loss and the forward + backward gradients are jitted
separately under the same plan and timed like the step; ``forward_ms`` is the forward's median,
``backward_ms`` = (forward + backward) - forward, ``optimizer_ms`` = step - (forward + backward) (the Adam
update and the step's bookkeeping). Separately compiled programs fuse differently, so the three are
estimates and may come out slightly negative for tiny models.

The record (``--out`` is read first): per-device compiled memory (``compiled_memory_mb``, from
``memory_analysis``; ``total`` = arguments + outputs - aliased + temporaries + generated code), the runtime
peak (``peak_allocated_mb``, where the backend reports ``peak_bytes_in_use``; else null), collectives per
step by kind from the compiled HLO (``snnjax.parallel.step_report``), compilations during the timed loop
(``recompile_count``, from jax's compile events) and warnings raised during the run (``warning_count``).
``previous``: the deltas (%) against the most recent earlier record of ``--out`` with the same
``comparison_key``. In a multi-process run only process 0 prints and writes.

``--compare-spikingjelly``: SpikingJelly's equivalent step (same architecture, global batch, T, Adam) on
ONE device (torch CPU, or one GPU with its fastest neuron backend of triton / torch), run by ``--sj-python``
in a process kept alive beside ours (``snnjax.bench.spikingjelly_train_step``); its steps and ours
alternate repetition by repetition. The record says what was compared (``comparison``: our mode, mesh and
device count against SpikingJelly's single device), and carries SpikingJelly's median step, throughput,
``ratio_spikingjelly_over_ours`` (above 1: we are faster), backend, torch's and SpikingJelly's versions,
and both sides' thread counts (``threads``, ``torch_threads``). float32 only.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
import time
import warnings
from typing import Any

from snnjax.bench.common import (
    append_jsonl,
    default_sj_backends,
    git_commit,
    read_jsonl,
    spikingjelly_fields,
    start_spikingjelly_steps,
)
from snnjax.bench.peer import interleave, thread_info, timed_ms
from snnjax.bench.workload import MODELS

MODES = ("none", "dp", "zero1", "zero2", "fsdp", "tp", "fsdp_tp", "dp_tp", "hybrid", "pp", "auto")
REGIMES = ("latency_strong_scaling", "throughput_weak_scaling", "memory_capacity")
DTYPES = ("float32", "bfloat16", "float64")
KEY_FIELDS = ("model", "mode", "mesh", "benchmark_regime", "batch_size_arg", "T", "dtype", "image_size",
              "width_div", "device_kind", "device_count", "process_count", "pp")
KEY_DEFAULTS = {"width_div": 1, "pp": None}  # fields added later: what records written before them ran
_MB = 2**20
_compiles = {"count": 0, "listening": False}  # backend compilations in this process (once listening)


def _count_compiles(event: str, _duration: float, **_kwargs) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _compiles["count"] += 1


def _listen_for_compiles() -> None:
    """Count jax's compilations from now on (jax has no public way to unregister, so register once)."""
    import jax

    if not _compiles["listening"]:
        jax.monitoring.register_event_duration_secs_listener(_count_compiles)
        _compiles["listening"] = True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m snnjax.bench.distributed", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=MODELS)
    p.add_argument("--mode", required=True, choices=MODES)
    p.add_argument("--mesh", help='axis sizes, e.g. "data=2,tensor=4" (default: the mode\'s mesh over all devices)')
    p.add_argument("--prefer", default="speed", choices=["speed", "memory"], help="objective of --mode auto")
    p.add_argument("--batch-size", type=int, default=8, help="global batch, or per data replica (weak scaling)")
    p.add_argument("--T", type=int, default=4)
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
    p.add_argument("--image-size", type=int, help="frame side for cifar10dvs_vgg / spikformer_ti")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="compute dtype (bfloat16: float32 params)")
    p.add_argument("--pp-schedule", default="1f1b", choices=["gpipe", "1f1b", "interleaved", "zero_bubble"],
                   help="--mode pp: the pipeline schedule")
    p.add_argument("--pp-microbatches", type=int, default=0, help="--mode pp: microbatches (0: automatic)")
    p.add_argument("--pp-virtual-stages", type=int, default=1, help="--mode pp: virtual stages per device")
    p.add_argument("--pp-layout", default="", help='--mode pp: units per stage, e.g. "4|5" ("": cost-balanced)')
    p.add_argument("--regime", default="latency_strong_scaling", choices=REGIMES)
    p.add_argument("--phases", action=argparse.BooleanOptionalAction, default=True,
                   help="also time forward and forward+backward (two more compilations)")
    p.add_argument("--width-div", type=int, default=1, help="divide every hidden width by K (1: full size)")
    p.add_argument("--compare-spikingjelly", action="store_true",
                   help="time SpikingJelly's single-device step beside ours, interleaved")
    p.add_argument("--sj-python", default=sys.executable, help="Python with torch and spikingjelly")
    p.add_argument("--sj-threads", type=int, default=thread_info()["schedulable_cores"],
                   help="torch.set_num_threads for SpikingJelly (default: the cores XLA's CPU pool uses)")
    p.add_argument("--sj-backends", nargs="+", choices=["torch", "triton", "cuda", "auto"],
                   help="SpikingJelly neuron backends (default: torch on a CPU, triton and torch on a GPU)")
    p.add_argument("--devices", type=int, help="fake N host CPU devices (sets XLA_FLAGS; CLI only, before jax)")
    p.add_argument("--out", help="JSONL file: read for the previous record, then appended to")
    args = p.parse_args(argv)
    if args.image_size is not None and args.model == "mlp":
        p.error("--image-size applies to cifar10dvs_vgg and spikformer_ti, not mlp")
    if args.mode == "pp" and not args.mesh:
        p.error("--mode pp needs --mesh with stage > 1 (e.g. --mesh stage=2,data=4)")
    if args.compare_spikingjelly and args.dtype != "float32":
        p.error("--compare-spikingjelly runs float32 only")
    for name in ("batch_size", "T", "steps", "width_div"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def _set_device_count(n: int) -> None:
    """Fake ``n`` host CPU devices; only possible before jax initialises its backends."""
    import jax
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        if jax.device_count() != n:
            raise ValueError(f"--devices {n}: jax is already initialised with {jax.device_count()} devices; "
                             "run the CLI in a fresh process (or set XLA_FLAGS yourself)")
        return
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={n}"])


@contextlib.contextmanager
def _x64(enabled: bool):
    import jax

    previous = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", enabled or previous)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


def _global_batch(model: str, batch: int, t: int, image_size: int | None, sharding_in, sharding_lab) -> dict:
    """The synthetic batch as global arrays; each process builds the same batch and keeps its shards."""
    import jax

    from snnjax.bench.train_step import make_batch

    x, y = make_batch(model, batch, t, image_size=image_size)
    return {"inputs": jax.make_array_from_callback(x.shape, sharding_in, lambda i: x[i]),
            "labels": jax.make_array_from_callback(y.shape, sharding_lab, lambda i: y[i])}


def _time_calls(call, steps: int, warmup: int) -> list[float]:
    """Milliseconds of ``steps`` calls of ``call()`` after ``warmup``, each ended by ``block_until_ready``."""
    import jax

    for _ in range(warmup):
        jax.block_until_ready(call())
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        jax.block_until_ready(call())
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _phase_fns(p, state, cfg, graphdef):
    """``(forward, grads)``: jitted ``(state, batch) -> loss`` and ``-> gradients`` under plan ``p``."""
    import jax
    from flax import nnx

    from snnjax.layers.conv_cpu import compiler_options
    from snnjax.parallel.logical import constrain
    from snnjax.train.step import classification_loss, model_inputs

    layout = p.step_layout(state.params)

    def loss(params, rngs, model_state, batch):
        fresh = functools.partial(jax.tree.map, lambda v: v)  # NNX Variables of this trace level
        model = nnx.merge(graphdef, layout.model_params(params), fresh(rngs), fresh(model_state))
        x = model_inputs(cfg, batch["inputs"], jax.random.key(cfg.seed))
        x = constrain(x, ("time", "batch") + (None,) * (x.ndim - 2))
        return classification_loss(model(x), constrain(batch["labels"], ("batch",)), cfg.loss).mean()

    def forward(state, batch):
        with layout.context():
            return loss(state.params, state.rngs, state.model_state, batch)

    def grads(state, batch):
        with layout.context():
            return layout.constrain_grads(jax.grad(loss)(state.params, state.rngs, state.model_state, batch))

    opts = compiler_options((state, cfg.compute_dtype), p.mesh.devices.flat[0].platform)
    return jax.jit(forward, compiler_options=opts), jax.jit(grads, compiler_options=opts)


def _peak_allocated_mb() -> float | None:
    """The largest ``peak_bytes_in_use`` of this process's devices (MiB), or None where not reported."""
    import jax

    peaks = []
    for d in jax.local_devices():
        try:
            stats = d.memory_stats() or {}
        except Exception:  # noqa: BLE001 (backends without memory stats raise various errors)
            stats = {}
        if "peak_bytes_in_use" in stats:
            peaks.append(stats["peak_bytes_in_use"])
    return max(peaks) / _MB if peaks else None


def compiled_memory_mb(compiled) -> dict[str, float]:
    """Per-device MiB of the compiled step (``memory_analysis``): arguments, outputs, aliased, temporaries,
    generated code and their ``total`` (arguments + outputs - aliased + temporaries + code)."""
    from snnjax.parallel.report import memory_stats

    mem = memory_stats(compiled)
    out = {k.removesuffix("_bytes"): v / _MB for k, v in mem.items()}
    if out:
        out["total"] = out["argument"] + out["output"] - out["alias"] + out["temp"] + out["generated_code"]
    return out


def collectives_mb(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``step_report``'s collectives as ``{kind: {"count", "mb"}}`` per step and device."""
    return {k: {"count": s["count"], "mb": s["bytes"] / _MB} for k, s in report["collectives"].items()}


def comparison_key(rec: dict[str, Any]) -> dict[str, Any]:
    """The fields two records must share to be compared."""
    return {k: rec.get(k, KEY_DEFAULTS.get(k)) for k in KEY_FIELDS}


def _pct(new, old) -> float | None:
    return None if new is None or not old else 100.0 * (new - old) / old


def previous_deltas(path: str | None, rec: dict[str, Any]) -> dict[str, Any] | None:
    """Deltas (%) of ``rec`` against the most recent record of ``path`` with the same comparison key, or None."""
    if not path or not os.path.exists(path):
        return None
    key, prev = comparison_key(rec), None
    for old in read_jsonl(path):
        if old.get("bench") == "distributed" and comparison_key(old) == key:
            prev = old  # later lines are newer
    if prev is None:
        return None
    return {"timestamp": prev.get("timestamp"),
            "step_latency_pct": _pct(rec["step_latency_ms"], prev.get("step_latency_ms")),
            "global_throughput_pct": _pct(rec["global_throughput_sps"], prev.get("global_throughput_sps")),
            "compiled_memory_pct": _pct(rec["compiled_memory_mb"].get("total"),
                                        (prev.get("compiled_memory_mb") or {}).get("total"))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Plan, compile and time one configuration; the record without ``previous``."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from snnjax import parallel
    from snnjax.bench.train_step import build_model
    from snnjax.parallel import mesh as mesh_lib
    from snnjax.parallel.pipeline_plan import PipelineOptions
    from snnjax.train.sharded import apply_plan
    from snnjax.train.step import StepConfig, TrainState, split_model

    _listen_for_compiles()
    dtype = jnp.dtype(args.dtype)
    net = build_model(args.model, args.T, nnx.Rngs(params=0, dropout=1), dtype=dtype,
                      param_dtype=dtype if args.dtype == "float64" else None, width_div=args.width_div,
                      image_size=args.image_size)
    mesh_arg = mesh_lib.make_mesh(args.mesh) if args.mesh else jax.device_count()
    strong = args.regime != "throughput_weak_scaling"
    start = time.perf_counter()
    pp = {}
    if args.mode == "pp":
        pp = {"pipeline": PipelineOptions(args.pp_schedule, args.pp_virtual_stages, args.pp_microbatches,
                                          args.pp_layout),
              "input_shape": (args.T, args.batch_size, *net_input_shape(args.model, args.image_size)),
              "compute_dtype": dtype}
    p = parallel.plan(net, mesh_arg, mode=args.mode, objective=args.prefer,
                      global_batch_size=args.batch_size if strong else None, **pp)
    optimize_ms = (time.perf_counter() - start) * 1e3
    if p.mesh is None:
        raise ValueError(f"mode {args.mode!r} planned a mesh of {p.axis_sizes} that this process's "
                         f"{jax.device_count()} devices cannot hold; give --mesh")
    replicas = p.axis_sizes["data"] * p.axis_sizes["fsdp"]
    global_batch = args.batch_size if strong else args.batch_size * replicas
    mesh_lib.check_batch_divides(p.mesh, global_batch)

    graphdef, params, rngs, rest = split_model(net)
    tx = optax.adam(1e-3)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                       opt_state=tx.init(params))
    cfg = StepConfig(seed=0, time_steps=args.T, encoder=None, compute_dtype=dtype)
    num_params = int(sum(x.size for x in jax.tree.leaves(params)))
    state, step = apply_plan(p, state, cfg, graphdef, tx)
    data = _global_batch(args.model, global_batch, args.T, args.image_size, p.batch_sharding(
        2 + len(net_input_shape(args.model, args.image_size)), 1), p.batch_sharding(1, 0))

    start = time.perf_counter()
    compiled = step.lower(state, data).compile()
    compile_ms = (time.perf_counter() - start) * 1e3
    report = parallel.step_report(compiled, state)
    holder = {"state": state}

    def one_step():
        holder["state"], metrics = step(holder["state"], data)
        return metrics

    for _ in range(args.warmup):
        jax.block_until_ready(one_step())
    timers, peers, sj_errors = {"ours": lambda: timed_ms(lambda: jax.block_until_ready(one_step()))}, {}, {}
    device = jax.devices()[0]
    if args.compare_spikingjelly:
        peers, sj_errors = start_spikingjelly_steps(
            args.sj_python, args.sj_backends or default_sj_backends(device.platform), model=args.model,
            batch=global_batch, t=args.T, width_div=args.width_div, image_size=args.image_size,
            threads=args.sj_threads, warmup=args.warmup, platform=device.platform)
        timers.update({f"sj:{b}": peer.time_once for b, peer in peers.items()})
    compiles_before = _compiles["count"]
    try:
        all_times = interleave(timers, args.steps)
    finally:
        for peer in peers.values():
            peer.close()
    recompiles = _compiles["count"] - compiles_before
    times = all_times["ours"]
    loss = float(one_step()["loss"])
    latency = statistics.median(times)

    phases: dict[str, float | None] = {"forward_ms": None, "backward_ms": None, "optimizer_ms": None}
    if args.phases and p.pipeline is None:  # the pipeline has no separate forward to time
        forward, grads = _phase_fns(p, holder["state"], cfg, graphdef)
        fwd = statistics.median(_time_calls(lambda: forward(holder["state"], data), args.steps, max(args.warmup, 1)))
        fwd_bwd = statistics.median(_time_calls(lambda: grads(holder["state"], data), args.steps,
                                                max(args.warmup, 1)))
        phases = {"forward_ms": fwd, "backward_ms": fwd_bwd - fwd, "optimizer_ms": latency - fwd_bwd}

    rec = {
        "bench": "distributed", "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": args.model, "mode": args.mode, "mode_chosen": p.mode, "objective": args.prefer,
        "plan_reasons": list(p.reasons),
        "mesh": dict(p.axis_sizes), "benchmark_regime": args.regime, "batch_size_arg": args.batch_size,
        "global_batch_size": global_batch, "per_rank_batch_size": global_batch // replicas,
        "data_replicas": replicas, "T": args.T, "dtype": args.dtype, "image_size": args.image_size,
        "input_shape": [args.T, global_batch, *net_input_shape(args.model, args.image_size)],
        "num_params": num_params, "device_kind": device.device_kind, "platform": device.platform,
        "device_count": jax.device_count(), "process_count": jax.process_count(),
        "step_latency_ms": latency, "step_min_ms": min(times),
        "global_throughput_sps": global_batch / latency * 1e3,
        "per_device_throughput_sps": global_batch / latency * 1e3 / jax.device_count(),
        **phases, "compile_ms": compile_ms, "optimize_ms": optimize_ms,
        "peak_allocated_mb": _peak_allocated_mb(), "compiled_memory_mb": compiled_memory_mb(compiled),
        "state_mb": {k.removesuffix("_bytes"): report[k] / _MB
                     for k in ("param_bytes", "optimizer_bytes", "model_state_bytes")},
        "collectives": collectives_mb(report), "recompile_count": recompiles, "loss": loss,
        "steps": args.steps, "warmup": args.warmup, "width_div": args.width_div, "threads": thread_info(),
        "jax_version": jax.__version__, "git_commit": git_commit(),
        "pp": None if p.pipeline_summary is None else {k: v for k, v in p.pipeline_summary.items() if k != "text"},
    }
    if args.compare_spikingjelly:
        rec.update(spikingjelly_fields(peers, all_times, latency, global_batch, sj_errors))
        rec["comparison"] = (f"ours: mode {args.mode} ({p.mode}) on {jax.device_count()} {device.platform} devices, "
                             f"mesh {dict(p.axis_sizes)}, global batch {global_batch}; SpikingJelly: 1 "
                             f"{rec.get('spikingjelly_device', device.platform)} device, batch {global_batch}; "
                             f"same architecture, T {args.T}, Adam, float32")
    return rec


def net_input_shape(model: str, image_size: int | None) -> tuple[int, ...]:
    """Per-example, per-time-step input shape (``train_step.input_shape``)."""
    from snnjax.bench.train_step import input_shape

    return input_shape(model, image_size)


def summary(rec: dict[str, Any]) -> str:
    """One line: configuration, latency, throughput, memory, collectives and deltas."""
    mesh = ",".join(f"{a}={s}" for a, s in rec["mesh"].items() if s > 1) or "1 device"
    mode = rec["mode"] + (f"->{rec['mode_chosen']}" if rec["mode"] == "auto" else "")
    coll = " ".join(f"{k} {v['count']}x{v['mb']:.2f}MiB" for k, v in rec["collectives"].items()
                    if v["count"] and k != "all-reduce+slice") or "no collectives"
    mem = rec["compiled_memory_mb"].get("total")
    line = (f"{rec['model']} {mode} [{mesh}] {rec['benchmark_regime']} N={rec['global_batch_size']} "
            f"({rec['per_rank_batch_size']}/replica) T={rec['T']} {rec['dtype']}: "
            f"{rec['step_latency_ms']:.1f} ms/step, {rec['global_throughput_sps']:.1f} samples/s, "
            f"compiled {'n/a' if mem is None else f'{mem:.1f}'} MiB/device, "
            f"compile {rec['compile_ms'] / 1e3:.1f} s; {coll}")
    if rec["forward_ms"] is not None:
        line += (f"; fwd {rec['forward_ms']:.1f} / bwd {rec['backward_ms']:.1f} / opt {rec['optimizer_ms']:.1f} ms")
    if rec["benchmark_regime"] == "memory_capacity":
        m = rec["compiled_memory_mb"]
        line += (f"\n  memory per device: arguments {m.get('argument', 0):.1f} MiB, temporaries {m.get('temp', 0):.1f} "
                 f"MiB, outputs {m.get('output', 0):.1f} MiB (aliased {m.get('alias', 0):.1f}), peak "
                 f"{rec['peak_allocated_mb'] if rec['peak_allocated_mb'] is not None else 'n/a'} MiB")
    if rec["recompile_count"] or rec["warning_count"]:
        line += f"; recompiles {rec['recompile_count']}, warnings {rec['warning_count']}"
    if "spikingjelly_ms" in rec:
        line += (f"\n  SpikingJelly ({rec['spikingjelly_backend']} backend, torch {rec['torch_version']}, "
                 f"{rec['torch_threads']} threads, 1 {rec['spikingjelly_device']} device, interleaved): "
                 f"{rec['spikingjelly_ms']:.1f} ms/step, {rec['spikingjelly_throughput_sps']:.1f} samples/s; "
                 f"ratio SJ/ours {rec['ratio_spikingjelly_over_ours']:.2f}x")
    elif "spikingjelly_error" in rec:
        line += f"\n  SpikingJelly unavailable ({rec['spikingjelly_error']})"
    if prev := rec.get("previous"):
        fmt = lambda v: "n/a" if v is None else f"{v:+.1f}%"  # noqa: E731
        line += (f"\n  vs {prev['timestamp']}: latency {fmt(prev['step_latency_pct'])}, throughput "
                 f"{fmt(prev['global_throughput_pct'])}, compiled memory {fmt(prev['compiled_memory_pct'])}")
    return line


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the record (also printed and appended to ``--out`` by process 0)."""
    args = parse_args(argv)
    if args.devices:
        _set_device_count(args.devices)
    from snnjax.runtime import distributed, hostmem

    distributed.initialize()  # under snnjax.runtime.launch (or a cluster): join the job; a single process: nothing

    hostmem.keep_freed_memory()  # as train.py and the other benchmarks do
    import jax

    load = os.getloadavg()[0]  # other work on the machine skews the timings
    with warnings.catch_warnings(record=True) as caught, _x64(args.dtype == "float64"):
        warnings.simplefilter("always")
        rec = run(args)
    rec.update(load_avg=load, load_avg_end=os.getloadavg()[0])
    rec["warning_count"] = len(caught)
    rec["warnings"] = sorted({f"{w.category.__name__}: {str(w.message)[:200]}" for w in caught})[:10]
    rec["previous"] = previous_deltas(args.out, rec)
    if jax.process_index() == 0:
        print(summary(rec), flush=True)
        append_jsonl(args.out, rec)
    return rec


if __name__ == "__main__":
    main()
