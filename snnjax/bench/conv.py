"""A zoo model's 2-D convolutions on the CPU, one by one: forward, input gradient, kernel gradient, per implementation.

    python -m snnjax.bench.conv [--model cifar10dvs_vgg] [--batch-size 8] [--T 4] [--image-size P]
        [--impls xla sparse onednn onednn-omp] [--density D] [--torch-python PATH] [--torch-threads K] [--reps 5]
        [--warmup 1] [--out F.jsonl]

The convolutions are the ones the model's train step calls (traced, not run: every distinct problem once, with the
number of its calls), at the step's batch (N * T for the models that fold the time steps into it). Implementations:
- ``xla``: the library's (``snnjax.layers.conv_cpu``: ``conv2d_nhwc``, ``input_grad``, ``weight_grad``) compiled with
  ``conv_cpu.compiler_options`` (XLA:CPU's Eigen convolutions for float32);
- ``sparse``: the library's sparse-input kernels (``snnjax.layers.sparse_conv``) for the forward and the kernel
  gradient (the input gradient is ``xla``'s), which ``conv_cpu`` takes on one device for inputs with few nonzeros:
  time it with ``--density D``, which makes every problem's input 0/1 spikes with a fraction D of ones (default:
  normal noise, no zeros);
- ``onednn``: oneDNN's convolution primitives through an XLA FFI call (``onednn_conv.cc``, built at first use by
  ``snnjax.cpp.build.build_library``), the batch cut into one slice per core of XLA's intra-op
  pool, each run by oneDNN on one thread; ``onednn-omp``: one oneDNN call on its OpenMP threads. They need
  oneDNN's library and headers: ``pip install onednn-cpu-gomp onednn-devel-cpu-gomp`` (the OpenMP build; the
  ``onednn`` wheel is the SYCL build, which needs Intel's compiler, TBB and SYCL runtimes). Without them the
  record says why and times the others;
- with ``--torch-python``: torch (``F.conv2d`` and its two gradient kernels, oneDNN inside) in NCHW
  (``torch-nchw``) and channels-last (``torch-cl``) memory, each in a peer process (``torch_conv.py``) with
  ``--torch-threads`` threads (default: the cores XLA's pool uses).
Each part of each problem is timed in turn by every implementation, repetition by repetition (``peer.interleave``).
Reported per problem and part: the median wall milliseconds and the median CPU milliseconds of the process that ran
it (all its threads: steadier than wall time on a shared machine, and what a busy CPU's cores actually did);
totals weighted by the call counts, and each implementation's total against ``xla``'s (above 1: faster than xla).
oneDNN's results are checked against ``xla``'s on the same operands (``max_rel_err``: the largest absolute
difference over the largest ``xla`` magnitude, of the three parts).
"""
from __future__ import annotations

import argparse
import functools
import os
import pathlib
import statistics
import sys
import time

from snnjax.bench.common import append_jsonl, git_commit
from snnjax.bench.peer import PeerError, interleave, start_script, thread_info
from snnjax.bench.workload import MODELS, make_batch

PARTS = ("forward", "input_grad", "kernel_grad")
ONEDNN_PACKAGES = "pip install onednn-cpu-gomp onednn-devel-cpu-gomp"
ONEDNN_SOURCE = pathlib.Path(__file__).with_name("onednn_conv.cc")


def onednn_dirs(prefix: str | None = None) -> tuple[pathlib.Path, pathlib.Path]:
    """``(include_dir, lib_dir)`` of the oneDNN that pip installed under ``prefix`` (default: this Python's).

    Raises NativeBuildError naming the packages when its headers or library are missing there.
    """
    from snnjax.cpp.build import NativeBuildError

    root = pathlib.Path(prefix or sys.prefix)
    include, lib = root / "include", root / "lib"
    if not (include / "oneapi" / "dnnl" / "dnnl.hpp").exists() or not (lib / "libdnnl.so").exists():
        raise NativeBuildError(f"oneDNN's headers and library are not under {root} (include/oneapi/dnnl/dnnl.hpp, "
                               f"lib/libdnnl.so): {ONEDNN_PACKAGES}")
    return include, lib


@functools.cache
def load_onednn():
    """The oneDNN convolution library (built once per machine), its FFI handler registered. Raises NativeBuildError
    when oneDNN is missing or the build fails; the failure is cached for the process."""
    from snnjax.cpp import build

    include, lib = onednn_dirs()
    sources = [ONEDNN_SOURCE, build.INCLUDE / "parallel_chunks.h"]
    return build.build_library("onednn_conv", "oneDNN convolution of the benchmark", sources,
                               ["SnnOnednnConvF32"],
                               ["-fopenmp", f"-I{include}", f"-L{lib}", "-ldnnl", f"-Wl,-rpath,{lib}"])


def onednn_conv(part: str, a, b, out_shape, strides, padding, parts: int):
    """oneDNN's ``part`` of a float32 NHWC / HWIO convolution: ``forward(x, w) -> y``, ``input_grad(dy, w) -> dx``,
    ``kernel_grad(x, dy) -> dw``; ``out_shape`` the result's shape, ``padding`` ``((top, bottom), (left, right))``;
    ``parts`` batch slices on XLA's pool (0: one call on OpenMP's threads). Loads the library (``load_onednn``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    load_onednn()
    call = jax.ffi.ffi_call("SnnOnednnConvF32", jax.ShapeDtypeStruct(tuple(out_shape), jnp.float32))
    return call(a, b, mode=np.int64(PARTS.index(part)), strides=np.asarray(strides, np.int64),
                padding=np.asarray(padding, np.int64).reshape(4), parts=np.int64(parts))


def model_convs(model: str, batch: int, t: int, image_size: int | None = None, **overrides) -> list[dict]:
    """The distinct 2-D convolutions of ``model``'s train step (float32, Adam), in call order: ``x`` and ``w`` shapes
    (NHWC / HWIO), ``strides``, ``padding`` pairs and ``calls`` (how often the traced step calls it). Only the plain
    ones (no dilation or groups), which ``snnjax.layers.conv_cpu`` runs."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from snnjax.bench.train_step import build_model
    from snnjax.layers import conv_cpu
    from snnjax.layers.conv import Conv2d
    from snnjax.train import step as S

    seen: dict[tuple, dict] = {}

    def recording(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None, dimension_numbers=None,
                  feature_group_count=1, batch_group_count=1, **kwargs):
        plain = (lhs.ndim == 4 and feature_group_count == 1 and batch_group_count == 1
                 and tuple(lhs_dilation or (1, 1)) == (1, 1) and tuple(rhs_dilation or (1, 1)) == (1, 1))
        if plain:
            pads = (lax_pads(lhs.shape[1:3], rhs.shape[:2], window_strides, padding) if isinstance(padding, str)
                    else tuple(tuple(int(v) for v in p) for p in padding))
            key = (tuple(lhs.shape), tuple(rhs.shape), tuple(int(s) for s in window_strides), pads)
            seen.setdefault(key, {"x": list(key[0]), "w": list(key[1]), "strides": list(key[2]),
                                  "padding": [list(p) for p in pads], "calls": 0})["calls"] += 1
        return conv_cpu.conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                                             dimension_numbers, feature_group_count, batch_group_count, **kwargs)

    lax_pads = jax.lax.padtype_to_pads
    net = build_model(model, t, nnx.Rngs(params=0, dropout=1), image_size=image_size, **overrides)
    for _, module in nnx.iter_graph(net):
        if isinstance(module, Conv2d):
            module.conv_general_dilated = recording
    graphdef, params, rngs, rest = S.split_model(net)
    tx = optax.adam(1e-3)
    state = S.TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                         opt_state=tx.init(params))
    cfg = S.StepConfig(seed=0, time_steps=t, encoder=None)
    x, y = make_batch(model, batch, t, image_size=image_size)
    jax.eval_shape(functools.partial(S.train_step, cfg, graphdef, tx), state,
                   {"inputs": jax.ShapeDtypeStruct(x.shape, x.dtype), "labels": jax.ShapeDtypeStruct(y.shape, y.dtype)})
    return list(seen.values())


def _ours(conv: dict, impls: list[str], parts: int, density: float | None = None) -> tuple[dict, dict]:
    """``({impl: {part: fn()}}, {impl: max_rel_err})``: each implementation's three parts on fixed random operands,
    compiled and run once; the errors of each against ``xla``'s results."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from snnjax.layers import conv_cpu, sparse_conv

    rng = np.random.default_rng(0)
    strides, pads = tuple(conv["strides"]), tuple(tuple(p) for p in conv["padding"])
    x = (rng.standard_normal(conv["x"], np.float32) if density is None
         else (rng.random(conv["x"]) < density).astype(np.float32))
    x = jnp.asarray(x)
    w = jnp.asarray(rng.standard_normal(conv["w"], np.float32) * 0.1)
    y_shape = jax.eval_shape(lambda: conv_cpu.conv2d_nhwc(x, w, strides, pads)).shape
    g = jnp.asarray(rng.standard_normal(y_shape, np.float32))
    opts = conv_cpu.compiler_options(jnp.float32)
    args = {"forward": (x, w), "input_grad": (g, w), "kernel_grad": (x, g)}
    shapes = {"forward": y_shape, "input_grad": x.shape, "kernel_grad": w.shape}
    fns = {"xla": {
        "forward": jax.jit(lambda x, w: conv_cpu.conv2d_nhwc(x, w, strides, pads), compiler_options=opts),
        "input_grad": jax.jit(lambda g, w: conv_cpu.input_grad(g, w, x.shape, strides, pads), compiler_options=opts),
        "kernel_grad": jax.jit(lambda x, g: conv_cpu.weight_grad(x, g, w.shape, strides, pads),
                               compiler_options=opts)}}
    if "sparse" in impls and not sparse_conv.supports(x.dtype, w.dtype, w.shape[2], w.shape[3]):
        fns["sparse"] = fns["xla"]  # channels the kernels do not take: the op runs XLA's there
    elif "sparse" in impls:
        fns["sparse"] = {
            "forward": jax.jit(lambda x, w: sparse_conv.forward(x, w, y_shape[1:3], strides, pads)),
            "input_grad": fns["xla"]["input_grad"],
            "kernel_grad": jax.jit(lambda x, g: sparse_conv.weight_grad(x, g, w.shape, strides, pads))}
    for impl in impls:
        if impl.startswith("onednn"):
            n = parts if impl == "onednn" else 0
            fns[impl] = {part: jax.jit(functools.partial(onednn_conv, part, out_shape=shapes[part], strides=strides,
                                                         padding=pads, parts=n)) for part in PARTS}
    ref = {part: fns["xla"][part](*args[part]) for part in PARTS}
    errors = {}
    for impl in fns:
        err = 0.0
        for part in PARTS:
            out = fns[impl][part](*args[part])
            err = max(err, float(jnp.max(jnp.abs(out - ref[part])) / jnp.max(jnp.abs(ref[part]))))
        errors[impl] = err
    runs = {impl: {part: functools.partial(lambda f, a: jax.block_until_ready(f(*a)), fns[impl][part], args[part])
                   for part in PARTS} for impl in fns}
    return runs, errors


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cifar10dvs_vgg", choices=MODELS)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--T", type=int, default=4)
    p.add_argument("--image-size", type=int, default=None, help="the image models' side (default: the workload's)")
    p.add_argument("--impls", nargs="+", default=["xla", "onednn", "onednn-omp"],
                   choices=["xla", "sparse", "onednn", "onednn-omp"])
    p.add_argument("--density", type=float, default=None,
                   help="inputs as 0/1 spikes with this fraction of ones (default: normal noise)")
    p.add_argument("--torch-python", default=None, help="a Python with torch: adds torch-nchw and torch-cl")
    p.add_argument("--torch-threads", type=int, default=None, help="torch's threads (default: XLA's pool's)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import jax

    from snnjax.cpp.build import NativeBuildError

    cores = thread_info()["xla_intra_op_threads"]
    impls = ["xla", *(i for i in dict.fromkeys(args.impls) if i != "xla")]
    rec = {"bench": "conv", "model": args.model, "batch_size": args.batch_size, "T": args.T,
           "image_size": args.image_size, "dtype": "float32", "reps": args.reps, "timing": "interleaved",
           "density": args.density,
           "device_kind": jax.devices()[0].device_kind, "jax_version": jax.__version__, "xla_threads": cores}
    if any(i.startswith("onednn") for i in impls):
        try:
            load_onednn()
        except NativeBuildError as e:
            rec["onednn_error"] = str(e)
            print(f"oneDNN left out: {e}", flush=True)
            impls = [i for i in impls if not i.startswith("onednn")]
    peers = {}
    if args.torch_python:
        threads = args.torch_threads or cores
        for label, fmt in (("torch-nchw", "contiguous"), ("torch-cl", "channels_last")):
            try:
                peers[label] = start_script(args.torch_python, "torch_conv.py",
                                            ["--format", fmt, "--threads", str(threads)])
            except PeerError as e:
                rec[f"{label}_error"] = str(e)
        if peers:
            ready = next(iter(peers.values())).ready
            rec.update(torch_version=ready["torch"], torch_threads=ready["threads"])
    labels = impls + list(peers)
    convs = model_convs(args.model, args.batch_size, args.T, args.image_size)
    totals = {label: {part: [0.0, 0.0] for part in PARTS} for label in labels}  # [wall, cpu] ms
    try:
        for conv in convs:
            runs, errors = _ours(conv, impls, cores, args.density)
            for pr in peers.values():
                pr.request("setup", x=conv["x"], w=conv["w"], strides=conv["strides"], padding=conv["padding"])
            conv["max_rel_err"] = errors
            for part in PARTS:
                cpu: dict[str, list[float]] = {label: [] for label in labels}

                def ours(label, part=part, cpu=cpu, runs=runs):
                    start = time.process_time()
                    wall = time.perf_counter()
                    runs[label][part]()
                    ms = (time.perf_counter() - wall) * 1e3
                    cpu[label].append((time.process_time() - start) * 1e3)
                    return ms

                def theirs(label, part=part, cpu=cpu):
                    reply = peers[label].request("time", part=part)
                    cpu[label].append(reply["cpu_ms"])
                    return reply["ms"]

                timers = {label: functools.partial(ours if label in runs else theirs, label) for label in labels}
                wall = interleave(timers, args.warmup + args.reps)
                for label in labels:
                    ms = statistics.median(wall[label][args.warmup:])
                    cpu_ms = statistics.median(cpu[label][args.warmup:])
                    conv.setdefault(label, {})[part] = {"ms": round(ms, 3), "cpu_ms": round(cpu_ms, 3)}
                    totals[label][part][0] += ms * conv["calls"]
                    totals[label][part][1] += cpu_ms * conv["calls"]
            print(f"{conv['x']} * {conv['w']} /{conv['strides']} x{conv['calls']}: " + "  ".join(
                f"{label} " + "/".join(f"{conv[label][part]['cpu_ms']:.1f}" for part in PARTS) for label in labels)
                + " CPU ms (fwd/dx/dw)", flush=True)
    finally:
        for pr in peers.values():
            pr.close()
    rec["convs"] = convs
    for label in labels:
        wall, cpu = (sum(totals[label][part][i] for part in PARTS) for i in (0, 1))
        rec[f"{label}_total_ms"], rec[f"{label}_total_cpu_ms"] = round(wall, 1), round(cpu, 1)
        rec[f"{label}_parts_cpu_ms"] = {part: round(totals[label][part][1], 1) for part in PARTS}
        if label == "xla":
            continue
        rec[f"xla_over_{label}"] = round(sum(totals["xla"][q][0] for q in PARTS) / wall, 3)
        rec[f"xla_over_{label}_cpu"] = round(sum(totals["xla"][q][1] for q in PARTS) / cpu, 3)
    rec.update(load_average=os.getloadavg()[0], git_commit=git_commit())
    print(" ".join(f"{label}: {rec[f'{label}_total_cpu_ms']:.0f} CPU ms ({rec.get(f'xla_over_{label}_cpu', 1):.2f}x), "
                   f"{rec[f'{label}_total_ms']:.0f} ms ({rec.get(f'xla_over_{label}', 1):.2f}x);" for label in labels)
          + f" load {rec['load_average']:.1f}", flush=True)
    append_jsonl(args.out, rec)
    return rec


if __name__ == "__main__":
    main()
