"""Neuron benchmark: LIF, PLIF or a catalogue neuron, forward + backward over ``[T, 64, C]`` for each impl, against
the copy roofline.

    python -m snnjax.bench.neuron [--neuron LIF|PLIF|CUBALIFNode|...] [--ts 4 8 16 32] [--features C]
                                  [--impls xla pallas ...] [--dtype float32|bfloat16|float16]
                                  [--compare-spikingjelly] [--out FILE.jsonl]

What is timed is one training-shaped call: ``(spikes, dX) = f(X, dS)``, the forward
spikes and the input gradient for a cotangent dS, jitted, of a LIF neuron with
SpikingJelly's defaults (tau 2, decay_input, hard reset to 0, threshold 1, Sigmoid(4));
``--neuron PLIF``: SpikingJelly's ``ParametricLIFNode(init_tau=2.0)`` defaults, the call also returning the gradient of
its decay parameter ``w``; ``--neuron NAME``, a recurrent catalogue neuron (``workload.CATALOGUE_NEURONS``): that
class with its (SpikingJelly's) defaults (``workload.CATALOGUE_KEYWORDS`` adds the keywords a class needs), run with
each of ``--impls`` (``CATALOGUE_IMPLS``; default ``auto``: on a CPU the native kernel generated from its step;
``assoc`` for a neuron that declares a linear recurrence), the call also returning the gradients of its learnable
parameters (KLIF's ``k``, GatedLIF's gates), as SpikingJelly's backward computes them. (SpikingJelly 2.0.0's
``LIAFNode`` runs with ``store_v_seq``: without it its multi-step call takes ``LIFNode``'s fused path and outputs
spikes, not ``act(H)``; its ``GatedLIFNode`` draws other initial gates, so its outputs differ from ours.)
Inputs are ``0.5 + N(0, 1)`` (about a tenth of the neuron-steps fire), drawn with numpy
from a seed per T, so SpikingJelly gets bit-identical inputs and its spike count and
gradient norm are compared with ours.

Per configuration: median (and min) milliseconds per call over ``--reps`` repetitions of
``--inner`` back-to-back calls ended by ``block_until_ready`` (as a training loop
dispatches), after warm-up; impls are interleaved, order alternating, since machines are
noisy. Effective GB/s counts the minimum traffic of a fused forward + backward, 5
element passes per neuron-step (forward: read X, write S; backward: read X again, read
dS, write dX): 20 B in float32, 10 B in bfloat16. The roofline fraction divides that by
the copy bandwidth measured in the same run (a jitted elementwise pass over 1 GiB,
``--copy-mib``, written in place; bytes read + written); the copy rate into a newly
allocated buffer is recorded beside it. Both processes (ours and SpikingJelly's) first
call ``snnjax.runtime.hostmem.keep_freed_memory()``, as ``train.py`` does, unless
``--default-allocator``: with glibc's default thresholds each call re-faults the pages of
its large buffers.

Impls: ``xla`` (the lax.scan custom-vjp path), ``scan`` (the single step under ``lax.scan``, plain autodiff),
``user`` (``UserLIF``, a LIF written through ``BaseNode``'s hooks as docs/neurons.md shows, run as ``impl="auto"``
runs it: on a CPU the native kernel generated from its step), ``user:IMPL`` (the same on ``scan``, ``native`` or
``pallas``),
``native`` (the fused C++ kernels, CPU), ``pallas`` (the fused Pallas kernels; default
``KernelOptions``), and ``pallas:key=value,...`` for other ``KernelOptions``
(``pallas:block_m=2048,num_warps=4``). The default is every impl that is compiled on this
backend: ``xla`` and ``native`` on a CPU (the Pallas kernels only run interpreted there),
``xla`` and ``pallas`` on a GPU.

``--compare-spikingjelly`` times SpikingJelly's own ``LIFNode`` / ``ParametricLIFNode`` / catalogue class
(``step_mode='m'``) on the
same shapes and inputs in a process of ``--sj-python`` per backend, kept alive beside ours
(``snnjax.bench.spikingjelly_lif``, ``snnjax.bench.peer``; needs torch and spikingjelly), its
repetitions interleaved with the impls' (torch gets ``--sj-threads`` threads; the records carry
both sides' thread counts and torch's and SpikingJelly's versions): the torch backend on a CPU;
on a GPU each of its CUDA implementations (``SJ_LIF_CUDA_IMPLEMENTATION`` / ``SJ_PLIF_CUDA_IMPLEMENTATION``:
triton, cuda, torch) that loads, and the ratio to the fastest. (SpikingJelly 2.0.0 has no CuPy backend; its native
``cuda`` one loads only when SpikingJelly was built from source; its bfloat16 ``LIFNode`` keeps V in bfloat16 and
runs the torch reference, backend ``auto``.) ``--out`` appends one JSON line per (impl, T) configuration.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import numpy as np

from snnjax.bench.peer import PeerError, interleave, start_script, thread_info, timed_ms
from snnjax.bench.workload import CATALOGUE_KEYWORDS, CATALOGUE_NEURONS
from snnjax.bench.workload import lif_inputs as make_inputs

BYTES_PASSES = 5  # fused fwd+bwd minimum: X, S (forward); X, dS, dX (backward)
DEFAULT_FEATURES = {"cpu": 16384, "gpu": 65536}
CATALOGUE_IMPLS = ("auto", "scan", "native", "pallas", "assoc")  # what --impls takes with a catalogue --neuron
DEFAULT_INNER = {"gpu": 10}  # calls per timed repetition: a GPU call is short enough for host sync to show


def min_bytes(t: int, batch: int, features: int, itemsize: int) -> int:
    """Fewest bytes a fused forward + backward must move over ``[t, batch, features]``."""
    return BYTES_PASSES * itemsize * t * batch * features


def parse_impl(spec: str):
    """``(name, KernelOptions or None)``.

    ``spec``: ``xla``, ``scan``, ``user``, ``user:IMPL``, ``native``, ``pallas`` or ``pallas:key=value,...``;
    for ``user:IMPL`` the second item is the impl name.
    """
    from snnjax.neurons.kernels import pallas as P

    name, _, opts = spec.partition(":")
    if name in ("xla", "scan", "user", "native") and not opts:
        return name, None
    if name == "user" and opts in ("scan", "native", "pallas"):
        return name, opts
    if name != "pallas":
        raise SystemExit(f"unknown impl {spec!r}: use xla, scan, user, user:IMPL, native, pallas or "
                         "pallas:key=value,...")
    fields = [f.name for f in dataclasses.fields(P.KernelOptions) if f.name != "interpret"]
    kwargs = {}
    for item in filter(None, opts.split(",")):
        key, _, value = item.partition("=")
        if key not in fields or not value.isdigit():
            raise SystemExit(f"bad KernelOptions item {item!r} in {spec!r}: use key=integer, keys {', '.join(fields)}")
        kwargs[key] = int(value)
    return name, P.KernelOptions(**kwargs)


def user_lif():
    """``UserLIF``: a LIF written as a user writes one (``BaseNode.neuronal_charge``; docs/neurons.md)."""
    from snnjax.neurons import BaseNode

    class UserLIF(BaseNode):
        def __init__(self, tau: float = 2.0, **kwargs):
            self.tau = tau
            super().__init__(**kwargs)

        def neuronal_charge(self, x, v, params):
            vr = 0.0 if self.v_reset is None else self.v_reset
            return v + (x - (v - vr)) / self.tau

    return UserLIF


def make_step(spec: str, cfg):
    """Jitted ``(x, ds) -> (spikes, dx)`` for one impl spec; PLIF: ``(spikes, dx, dw)``, its decay parameter ``w``
    at SpikingJelly's ``init_tau=2`` (w = 0)."""
    import jax

    from snnjax import neurons
    from snnjax.neurons.kernels import pallas as P

    name, opts = parse_impl(spec)
    if name in ("xla", "scan", "native"):
        run = lambda x, w: neurons.multistep(cfg, x, w=w, impl=name)[0]  # noqa: E731
    elif name == "user":
        if cfg.kind != "LIF":
            raise SystemExit(f"impl 'user' times a LIF written through BaseNode's hooks; not with --neuron {cfg.kind}")
        node = user_lif()(tau=cfg.tau, step_mode="m", impl=opts or "auto")
        run = lambda x, w: node(x)  # noqa: E731
    else:
        run = lambda x, w: P.multistep(cfg, x, w=w, options=opts)[0]  # noqa: E731

    if cfg.kind == "PLIF":
        def step(x, ds):
            spikes, vjp = jax.vjp(run, x, jax.numpy.zeros((), jax.numpy.float32))
            return spikes, *vjp(ds)
    else:
        def step(x, ds):
            spikes, vjp = jax.vjp(lambda x: run(x, None), x)
            return spikes, vjp(ds)[0]

    return jax.jit(step)


def catalogue_step(name: str, t: int, impl: str = "auto"):
    """Jitted ``(x, ds) -> (outputs, dx, {param: grad})`` of catalogue neuron ``name`` (multi-step, its defaults
    and ``CATALOGUE_KEYWORDS``; GatedLIFNode built for ``t`` steps) run with ``impl``."""
    import jax
    from flax import nnx

    from snnjax.neurons import catalogue

    kwargs = dict(CATALOGUE_KEYWORDS.get(name, {}))
    if "act" in kwargs:
        kwargs["act"] = getattr(jax.nn, kwargs["act"])
    if name == "GatedLIFNode":
        kwargs["T"] = t
    node = getattr(catalogue, name)(**kwargs, step_mode="m", impl=impl)
    graphdef, params, rest = nnx.split(node, nnx.Param, ...)

    def run(x, params):
        return nnx.merge(graphdef, params, rest)(x)

    def step(x, ds):
        out, vjp = jax.vjp(run, x, params)
        dx, dparams = vjp(ds)
        return out, dx, {k: v for k, v in nnx.to_flat_state(dparams)}

    return jax.jit(step)


def measure_copy_gbps(reps: int, inner: int, nbytes: int = 1 << 30) -> tuple[float, float]:
    """Device copy bandwidth in GB/s (bytes read + written) of a jitted elementwise pass over ``nbytes``.

    Returns ``(in_place, fresh)``: writing over the donated input (the memory system's rate),
    and writing a newly allocated output, as every op returning a new array does. On a CPU
    the second is lower: each new page costs a page fault on first touch.
    """
    import jax
    import jax.numpy as jnp

    n = nbytes // 4
    rates = []
    for donate in (True, False):
        neg = jax.jit(lambda a: -a, donate_argnums=0 if donate else ())
        buf = jax.block_until_ready(neg(jnp.full((n,), 1.0, jnp.float32)))
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            for _ in range(inner):
                out = neg(buf)
                if donate:
                    buf = out
            jax.block_until_ready(out)
            times.append((time.perf_counter() - start) / inner)
            del out
        rates.append(2 * 4 * n / statistics.median(times) / 1e9)
        del buf
    return rates[0], rates[1]


def time_impls(steps: dict, x, ds, reps: int, warmup: int, inner: int, peers: dict | None = None
               ) -> dict[str, list[float]]:
    """Milliseconds per call of each step function (``inner`` calls per repetition, one sync) and of each peer's
    ``time`` request (``{label: Peer}``, already set up), interleaved repetition by repetition."""
    import jax

    for fn in steps.values():
        for _ in range(max(warmup, 1)):
            jax.block_until_ready(fn(x, ds))

    def ours(fn):
        return lambda: timed_ms(lambda: jax.block_until_ready([fn(x, ds) for _ in range(inner)]), 1) / inner

    timers = {name: ours(fn) for name, fn in steps.items()}
    timers.update({label: peer.time_once for label, peer in (peers or {}).items()})
    return interleave(timers, reps)


def summarize(spikes, dx, dw=None) -> dict:
    """Spike count, gradient L2 norm and PLIF's ``dw`` (a catalogue neuron's: ``{param: grad}``, summed per parameter)
    (compared across impls and with SpikingJelly)."""
    out = {"spikes": float(np.sum(np.asarray(spikes, np.float64))),
           "dx_norm": float(np.linalg.norm(np.asarray(dx, np.float64).ravel()))}
    if isinstance(dw, dict):
        return {**out, "dparams": {".".join(map(str, k)): float(np.sum(np.asarray(v, np.float64)))
                                   for k, v in dw.items()}}
    return out if dw is None else {**out, "dw": float(dw)}


def start_spikingjelly(python: str, backends, device: str, batch: int, features: int, dtype: str, warmup: int,
                      inner: int, threads: int, keep_freed_memory: bool, neuron: str = "LIF") -> tuple[dict, dict]:
    """``({backend: Peer}, {backend: error})``: one ``spikingjelly_lif.py`` peer per backend that starts."""
    peers, errors = {}, {}
    for backend in backends:
        args = ["--backend", backend, "--device", device, "--batch", str(batch), "--features", str(features),
                "--dtype", dtype, "--warmup", str(warmup), "--inner", str(inner), "--threads", str(threads),
                "--neuron", neuron]
        if keep_freed_memory:
            args.append("--keep-freed-memory")
        env = dict(os.environ, **{f"SJ_{neuron}_CUDA_IMPLEMENTATION": backend}) if backend != "cpu" else None
        try:
            peers[backend] = start_script(python, "spikingjelly_lif.py", args, env=env)
        except (PeerError, OSError) as e:
            errors[backend] = str(e)
    return peers, errors


def _run_t(t: int, args, steps: dict, peers: dict, sj_errors: dict, dtype, features: int, inner: int,
           copy_gbps: float, copy_fresh_gbps: float, keep_freed: bool, device) -> list[dict]:
    """Time every impl and SpikingJelly peer at one T, interleaved; print and return one record per impl."""
    import jax
    import jax.numpy as jnp

    x_np, ds_np = make_inputs(t, args.batch, features)
    x, ds = jnp.asarray(x_np, dtype), jnp.asarray(ds_np, dtype)
    del x_np, ds_np
    sums = {}
    for name in list(steps):
        try:
            sums[name] = summarize(*steps[name](x, ds))
        except Exception as e:  # noqa: BLE001 (an impl that cannot compile here is reported and dropped)
            print(f"  {name}: dropped, {type(e).__name__}: {str(e)[:300]!r}", flush=True)
            del steps[name]
    sj_sums, live = {}, {}
    for backend, peer in peers.items():
        try:
            sj_sums[backend] = peer.request("setup", T=t)
            live[f"sj:{backend}"] = peer
        except PeerError as e:
            sj_errors[backend] = f"T={t}: {e}"
            print(f"  SpikingJelly {backend} T={t}: unavailable ({e})", flush=True)
    times = time_impls(steps, x, ds, args.reps, args.warmup, inner, peers=live)
    del x, ds
    sj_t = {b: {"median_ms": statistics.median(times[f"sj:{b}"]), "min_ms": min(times[f"sj:{b}"]), **sj_sums[b]}
            for b in sj_sums}
    best_sj = min(sj_t.items(), key=lambda kv: kv[1]["median_ms"]) if sj_t else None
    nbytes = min_bytes(t, args.batch, features, dtype.itemsize)
    records = []
    for name in steps:
        ts_ms = times[name]
        med = statistics.median(ts_ms)
        gbps = nbytes / (med * 1e-3) / 1e9
        rec = {
            "bench": "neuron", "device_kind": device.device_kind, "platform": device.platform,
            "impl": name, "neuron": args.neuron, "T": t, "shape": [t, args.batch, features], "dtype": dtype.name,
            "median_ms": med, "min_ms": min(ts_ms), "reps": len(ts_ms), "inner": inner, "min_bytes": nbytes,
            "gb_per_s": gbps, "copy_gb_per_s": copy_gbps,
            "copy_fresh_gb_per_s": copy_fresh_gbps, "roofline_fraction": gbps / copy_gbps,
            "host_allocator": "keep_freed_memory" if keep_freed else "default", "threads": thread_info(),
            **sums[name], "jax_version": jax.__version__, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        line = f"{t:>3} {name:<28} {med:>9.3f} {gbps:>8.1f} {gbps / copy_gbps:>9.2f}"
        if args.compare_spikingjelly:
            rec["spikingjelly"] = sj_t
            rec["spikingjelly_errors"] = dict(sj_errors) or None
            if best_sj is not None:
                b, r = best_sj
                ready = peers[b].ready
                rec.update(spikingjelly_backend=b, spikingjelly_ms=r["median_ms"],
                           speedup_vs_spikingjelly=r["median_ms"] / med, timing="interleaved",
                           torch_version=ready["torch_version"], spikingjelly_version=ready["spikingjelly_version"],
                           torch_threads=ready["torch_threads"], spikingjelly_implementation=ready["implementation"],
                           spikingjelly_spikes_match=r["spikes"] == sums[name]["spikes"],
                           spikingjelly_dw=r.get("dw"), spikingjelly_dparams=r.get("dparams"),
                           spikingjelly_dx_norm_rel_diff=abs(r["dx_norm"] - sums[name]["dx_norm"])
                           / max(r["dx_norm"], 1e-30))
                line += f" {r['median_ms']:>11.3f} {b:>11} {r['median_ms'] / med:>7.2f}x"
        print(line, flush=True)
        records.append(rec)
    return records


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--neuron", default="LIF", choices=["LIF", "PLIF", *CATALOGUE_NEURONS],
                   help="LIF, PLIF or a recurrent catalogue neuron (impls: CATALOGUE_IMPLS)")
    p.add_argument("--ts", type=int, nargs="+", default=[4, 8, 16, 32], help="time steps (default 4 8 16 32)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--features", type=int, help="C (default: 16384 on a CPU, 65536 on a GPU)")
    p.add_argument("--impls", nargs="+", help="impl specs (default: xla and native on a CPU, xla and pallas on a GPU)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--reps", type=int, default=20, help="timed repetitions per impl and T")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--inner", type=int, help="calls per timed repetition, one sync at its end (default: 10 on a "
                   "GPU, where the device would otherwise idle through each sync; 1 on a CPU)")
    p.add_argument("--copy-mib", type=int, default=1024, help="buffer size of the copy-bandwidth measurement")
    p.add_argument("--compare-spikingjelly", action="store_true",
                   help="also time SpikingJelly's LIFNode on the same shapes (needs torch + spikingjelly)")
    p.add_argument("--sj-backends", nargs="+",
                   help="SpikingJelly backends (default: cpu on a CPU; on a GPU triton cuda torch in float32, auto "
                        "in a low precision, where SpikingJelly runs its torch reference and refuses a named one)")
    p.add_argument("--sj-python", default=sys.executable,
                   help="Python interpreter that has torch and spikingjelly (default: this one)")
    p.add_argument("--sj-threads", type=int, default=thread_info()["schedulable_cores"],
                   help="torch.set_num_threads for SpikingJelly (default: the cores XLA's CPU pool uses)")
    p.add_argument("--default-allocator", action="store_true",
                   help="leave glibc's malloc thresholds alone (default: snnjax.runtime.hostmem.keep_freed_memory, as "
                        "train.py does, in this process and SpikingJelly's)")
    p.add_argument("--out", help="append one JSON line per (impl, T) to this file")
    args = p.parse_args(argv)

    from snnjax.runtime import hostmem

    keep_freed = not args.default_allocator and hostmem.keep_freed_memory()

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave GPU memory to SpikingJelly's run
    import jax
    import jax.numpy as jnp

    from snnjax import neurons

    device = jax.devices()[0]
    platform = "gpu" if device.platform in ("gpu", "cuda", "rocm") else device.platform
    features = args.features or DEFAULT_FEATURES.get(platform, 16384)
    catalogue = args.neuron in CATALOGUE_NEURONS
    if catalogue and not set(args.impls or ()) <= set(CATALOGUE_IMPLS):
        raise SystemExit(f"--neuron {args.neuron} runs on the impls {', '.join(CATALOGUE_IMPLS)}; "
                         f"got --impls {' '.join(args.impls)}")
    impls = (args.impls or ["auto"] if catalogue
             else args.impls or (["xla", "pallas"] if platform == "gpu" else ["xla", "native"]))
    sj_backends = args.sj_backends or (["cpu"] if platform != "gpu" else ["triton", "cuda", "torch"]
                                       if args.dtype == "float32" else ["auto"])
    dtype = jnp.dtype(args.dtype)
    if catalogue:
        def steps_at(t):
            return {impl: catalogue_step(args.neuron, t, impl) for impl in impls}
    else:
        cfg = neurons.NeuronConfig(kind=args.neuron, tau=2.0)
        built = {spec: make_step(spec, cfg) for spec in impls}

        def steps_at(t):
            return built

    inner = args.inner or DEFAULT_INNER.get(platform, 1)
    copy_gbps, copy_fresh_gbps = measure_copy_gbps(max(args.reps, 10), inner, args.copy_mib << 20)
    print(f"{args.neuron} fwd+bwd (outputs and dX), [T, {args.batch}, {features}] {dtype.name}, {device.platform} "
          f"({device.device_kind}), median of {args.reps}; host allocator "
          f"{'keep_freed_memory' if keep_freed else 'default'}; copy bandwidth {copy_gbps:.1f} GB/s in place, "
          f"{copy_fresh_gbps:.1f} GB/s into a new buffer; "
          f"roofline {BYTES_PASSES * dtype.itemsize} B per neuron-step", flush=True)
    peers, sj_errors = {}, {}
    if args.compare_spikingjelly:
        peers, sj_errors = start_spikingjelly(args.sj_python, sj_backends, "cuda" if platform == "gpu" else "cpu",
                                              args.batch, features, args.dtype, args.warmup, inner, args.sj_threads,
                                              keep_freed, args.neuron)
        for backend, err in sj_errors.items():
            print(f"  SpikingJelly {backend}: unavailable ({err})", flush=True)

    header = f"{'T':>3} {'impl':<28} {'ms':>9} {'GB/s':>8} {'roofline':>9}"
    if args.compare_spikingjelly:
        header += f" {'SJ best ms':>11} {'SJ backend':>11} {'speedup':>8}"
    print(header)
    records = []
    try:
        for t in args.ts:
            records += _run_t(t, args, steps_at(t), peers, sj_errors, dtype, features, inner, copy_gbps,
                              copy_fresh_gbps, keep_freed, device)
    finally:
        for peer in peers.values():
            peer.close()
    if args.out:
        with open(args.out, "a") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
    return records


if __name__ == "__main__":
    main()
