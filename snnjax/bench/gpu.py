"""The GPU checks in one command: the compiled kernels, neuron and training-step timings against SpikingJelly.

    python -m snnjax.bench.gpu [--out-dir DIR] [--sj-wheels DIR] [--budget-s S] [--parts pallas neuron train]
                               [--tiny]

Parts, in this order, each in this process:

1. ``pallas``: ``snnjax.bench.pallas_check``, the fused Pallas kernels compiled for the device (interpreted on a
   CPU) against the XLA path over every kind x reset x surrogate, float32 and bfloat16, and the kernels generated
   from a step (a user's LIF, the catalogue) against the scan path.
2. ``neuron``: ``snnjax.bench.neuron`` for LIF and PLIF, float32 and float16, over ``[T, 64, 65536]``, T = 4, 8,
   16, 32, our ``xla`` and ``pallas`` paths against SpikingJelly's ``triton`` and ``torch`` CUDA implementations
   on the same inputs, interleaved (in float16 SpikingJelly 2.0.0 refuses both and runs its torch reference:
   backend ``auto``); for LIF also ``user:pallas``, a LIF written through ``BaseNode``'s hooks on the Pallas
   kernels generated from its step.
3. ``train``: ``snnjax.bench.train_step`` (forward, backward, Adam) in float32 and bfloat16 for
   CIFAR10DVSVGG (batch 32, T = 10, 48 x 48 frames), Spiking ResNet-18 (batch 100, T = 32, 32 x 32 images:
   the temporal-fusion paper's setting), SEW-ResNet-18 (batch 32, T = 4, 64 x 64 frames) and Spikformer-Ti
   (batch 64, T = 4, 32 x 32 images), each against SpikingJelly's fastest neuron implementation on the same
   device, with the compiled step's peak memory.

Records go to ``DIR/{pallas_check,neuron,train_step}_<device>.jsonl`` (``<device>`` from the device kind:
``h100``, ``h200``, ``cpu``; every record carries ``device_kind``), and one summary record per part (status,
seconds, the reason a part was skipped) to ``DIR/gpu_check_<device>.jsonl``. ``--budget-s`` bounds the whole
run (default 480 s): a part or run that would start with less than its estimated time left is skipped and
the summary says so. Training runs go float32 first, model by model, then bfloat16. On an H200 13 of the 14
runs took 427 s (kernels 56 s, each neuron run 41-80 s, each training run 14-23 s; the 14th, 17 s, was left to
the budget); on an H100, before the kernels generated from a step joined, the kernels took 33 s, each neuron run
57-82 s and each float32 training run 41-52 s, so there the default 480 s skips the bfloat16 steps
(``--budget-s 720`` runs them all).

SpikingJelly is not installed on a lent GPU machine: ``--sj-wheels DIR`` installs every wheel in DIR
(spikingjelly and what it needs that the machine lacks, e.g. loguru) with ``pip install --no-deps --no-index
--target`` into a temporary folder that only SpikingJelly's peer processes import from. Fetch them once where
pip reaches PyPI: ``pip download --no-deps -d .whl spikingjelly==2.0.0 loguru``.

``--tiny`` runs every part's code at tiny sizes on whatever device is present (three kernel cases; LIF in float32
and PLIF in float16 over ``[T, 8, 256]``; CIFAR10DVSVGG with its widths divided by 64, batch 2, T = 2, in float32
and bfloat16): the test suite's CPU dry run. Exit status 1 when a kernel case fails or a part raises.
"""
from __future__ import annotations

import argparse
import fnmatch
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from snnjax.bench.common import append_jsonl, git_commit

PARTS = ("pallas", "neuron", "train")
NEURON_RUNS = [(neuron, dtype) for dtype in ("float32", "float16") for neuron in ("LIF", "PLIF")]
# (model, batch, T, image side); SpikingJelly's published CIFAR10DVSVGG figure is at batch 32, T = 10
TRAIN_RUNS = [("cifar10dvs_vgg", 32, 10, 48), ("spiking_resnet18", 100, 32, 32), ("sew_resnet18", 32, 4, 64),
              ("spikformer_ti", 64, 4, 32)]
TINY_NEURON_RUNS = [("LIF", "float32"), ("PLIF", "float16")]
# seconds a run took (compile, warm-up, timed repetitions, SpikingJelly's start): the H100's neuron and train runs,
# the H200's kernel run (77 cases since the generated kernels joined)
ESTIMATE_S = {"pallas": 60, "neuron": 75, "train": 55}


def device_tag(kind: str, platform: str) -> str:
    """A short file-name tag for a device: ``h100`` for "NVIDIA H100 80GB HBM3", the platform otherwise."""
    found = re.search(r"\b([A-Za-z]\d{2,4})\b", kind) if platform != "cpu" else None
    return found.group(1).lower() if found else platform


def install_wheels(folder: str) -> str:
    """Install every wheel in ``folder`` (no dependencies, no index) into a new temporary folder; returns it."""
    wheels = sorted(glob.glob(os.path.join(folder, "*.whl")))
    if not wheels:
        raise SystemExit(f"--sj-wheels {folder}: no .whl files there; fetch them with "
                         f"`pip download --no-deps -d {folder} spikingjelly==2.0.0 loguru`")
    target = tempfile.mkdtemp(prefix="snnjax-sj-")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", target, *wheels], check=True)
    return target


def neuron_argv(neuron: str, dtype: str, tiny: bool, sj_python: str, out: str) -> list[str]:
    argv = ["--neuron", neuron, "--dtype", dtype, "--compare-spikingjelly", "--sj-python", sj_python, "--out", out]
    if tiny:
        return argv + ["--ts", "2", "4", "--batch", "8", "--features", "256", "--reps", "2", "--warmup", "1",
                       "--inner", "1", "--copy-mib", "16", "--sj-backends", "cpu", "--impls", "xla", "pallas",
                       *(["user:pallas"] if neuron == "LIF" else [])]
    backends = ["triton", "torch"] if dtype == "float32" else ["auto"]  # SpikingJelly's low precision: its reference
    impls = ["xla", "pallas", "user:pallas"] if neuron == "LIF" else ["xla", "pallas"]  # user: the generated kernels
    return argv + ["--ts", "4", "8", "16", "32", "--features", "65536", "--reps", "10", "--sj-backends", *backends,
                   "--impls", *impls]


def train_argv(model: str, batch: int, t: int, image: int, dtype: str, tiny: bool, sj_python: str,
               out: str) -> list[str]:
    argv = ["--model", model, "--dtype", dtype, "--compare-spikingjelly", "--sj-python", sj_python, "--out", out]
    if tiny:
        return argv + ["--batch-size", "2", "--T", "2", "--image-size", "16", "--width-div", "64", "--steps", "1",
                       "--warmup", "1"]
    return argv + ["--batch-size", str(batch), "--T", str(t), "--image-size", str(image), "--steps", "5",
                   "--warmup", "2"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default="benchmarks/results", help="folder of the JSONL records")
    p.add_argument("--sj-wheels", help="a folder of wheels to install SpikingJelly from (for its processes only)")
    p.add_argument("--sj-python", default=sys.executable, help="the Python that runs SpikingJelly (default: this one)")
    p.add_argument("--budget-s", type=float, default=480.0, help="skip what would start past this many seconds")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--only", nargs="+", metavar="PATTERN",
                   help="run only the runs whose label matches one of these shell patterns (labels: 'pallas', "
                        "'neuron LIF float32', 'train sew_resnet18 bfloat16', ...), e.g. 'train * bfloat16'")
    p.add_argument("--tiny", action="store_true", help="tiny sizes on any device (the suite's dry run)")
    args = p.parse_args(argv)
    start = time.perf_counter()
    if args.sj_wheels:
        site = install_wheels(args.sj_wheels)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # SpikingJelly shares the GPU
    import jax

    from snnjax.bench import neuron, pallas_check, train_step

    device = jax.devices()[0]
    tag = device_tag(device.device_kind, device.platform)
    os.makedirs(args.out_dir, exist_ok=True)
    path = {name: os.path.join(args.out_dir, f"{name}_{tag}.jsonl")
            for name in ("pallas_check", "neuron", "train_step", "gpu_check")}
    print(f"GPU checks on {device.platform} ({device.device_kind}), jax {jax.__version__}, budget "
          f"{args.budget_s:.0f} s, records in {args.out_dir}/*_{tag}.jsonl", flush=True)

    runs = []
    if "pallas" in args.parts:
        limit = ["--shape", "3", "2", "37", "--limit", "3"] if args.tiny else []
        runs.append(("pallas", "pallas", lambda: pallas_check.main(["--out", path["pallas_check"], *limit])))
    if "neuron" in args.parts:
        runs += [(f"neuron {n} {d}", "neuron", lambda n=n, d=d: neuron.main(
            neuron_argv(n, d, args.tiny, args.sj_python, path["neuron"])))
                 for n, d in (TINY_NEURON_RUNS if args.tiny else NEURON_RUNS)]
    if "train" in args.parts:
        runs += [(f"train {m} {d}", "train", lambda m=m, b=b, t=t, s=s, d=d: train_step.main(
            train_argv(m, b, t, s, d, args.tiny, args.sj_python, path["train_step"])))
                 for d in ("float32", "bfloat16") for m, b, t, s in TRAIN_RUNS[:1 if args.tiny else None]]

    if args.only:
        runs = [r for r in runs if any(fnmatch.fnmatchcase(r[0], pattern) for pattern in args.only)]
        if not runs:
            raise SystemExit(f"--only {' '.join(args.only)}: no run matches; labels are 'pallas', "
                             "'neuron NEURON DTYPE', 'train MODEL DTYPE'")
    failed = 0
    for label, part, run in runs:
        elapsed = time.perf_counter() - start
        rec = {"bench": "gpu_check", "run": label, "device_kind": device.device_kind, "platform": device.platform,
               "tiny": args.tiny, "jax_version": jax.__version__, "git_commit": git_commit(),
               "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        if not args.tiny and elapsed + ESTIMATE_S[part] > args.budget_s:
            rec.update(status="skipped", reason=f"{elapsed:.0f} s of the {args.budget_s:.0f} s budget spent")
            print(f"== {label}: skipped ({rec['reason']})", flush=True)
        else:
            print(f"== {label} (at {elapsed:.0f} s)", flush=True)
            t0 = time.perf_counter()
            try:
                result = run()
                rec["status"] = "failed" if part == "pallas" and result else "ok"
            except Exception as e:  # noqa: BLE001 (one part's failure is recorded; the others still run)
                rec.update(status="failed", error=f"{type(e).__name__}: {str(e)[:500]}")
                print(f"   failed: {rec['error']}", flush=True)
            except SystemExit as e:  # a bench's argparse or set-up refusal
                rec.update(status="failed", error=f"SystemExit: {e.code}")
            rec["seconds"] = round(time.perf_counter() - t0, 1)
            failed += rec["status"] == "failed"
        append_jsonl(path["gpu_check"], rec)
    total = time.perf_counter() - start
    print(json.dumps({"runs": len(runs), "failed": failed, "seconds": round(total, 1), "records": path}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
