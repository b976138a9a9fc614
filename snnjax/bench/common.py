"""Helpers the benchmark CLIs share (no jax import here: CLIs may set XLA flags after importing this)."""
from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator


def git_commit() -> str | None:
    """The repository's HEAD commit, with ``-dirty`` if tracked files changed; None outside a git checkout."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        out = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "-uno"], capture_output=True, text=True)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def read_jsonl(path: str) -> Iterator[dict]:
    """The JSON-object lines of ``path`` in order (lines that are not objects, e.g. cut off, skipped)."""
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                yield rec


def append_jsonl(path: str | None, record: dict) -> None:
    """Append ``record`` as one JSON line to ``path`` (nothing when ``path`` is None)."""
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def default_sj_backends(platform: str, dtype: str = "float32") -> tuple[str, ...]:
    """SpikingJelly's neuron backends to try: ``torch`` on a CPU; on a GPU its CUDA implementations ``triton`` and
    ``torch`` (the fastest that runs is compared; its native ``cuda`` one is built only from source) in float32, and
    ``auto`` in a low precision: SpikingJelly 2.0.0 runs its torch reference there and refuses a named one."""
    if platform not in ("gpu", "cuda", "rocm"):
        return ("torch",)
    return ("triton", "torch") if dtype == "float32" else ("auto",)


def start_spikingjelly_steps(python: str, backends, *, model: str, batch: int, t: int, width_div: int = 1,
                             image_size: int | None = None, threads: int, warmup: int, platform: str = "cpu",
                             dtype: str = "float32", wait: bool = True):
    """``({backend: Peer}, {backend: error})``: one ``spikingjelly_train_step.py`` peer per backend that starts.

    ``wait=False`` returns the started processes at once, still warming up: pass the pair to ``ready_peers``
    after our own compile (the two overlap)."""
    from snnjax.bench.peer import start_script

    args = ["--model", model, "--T", str(t), "--batch-size", str(batch), "--width-div", str(width_div),
            "--device", "cuda" if platform in ("gpu", "cuda", "rocm") else "cpu", "--threads", str(threads),
            "--warmup", str(warmup), "--dtype", dtype]
    if image_size is not None:
        args += ["--image-size", str(image_size)]
    peers, errors = {}, {}
    for backend in backends:
        try:
            peers[backend] = start_script(python, "spikingjelly_train_step.py", [*args, "--backend", backend],
                                          wait=False)
        except OSError as e:
            errors[backend] = str(e)
    return ready_peers(peers, errors) if wait else (peers, errors)


def ready_peers(peers: dict, errors: dict) -> tuple[dict, dict]:
    """``peers`` whose start-up object arrived; each one that failed to start moves to ``errors`` (its message)."""
    from snnjax.bench.peer import PeerError

    live = {}
    for backend, peer in peers.items():
        try:
            peer.wait_ready()
            live[backend] = peer
        except PeerError as e:
            errors[backend] = str(e)
    return live, errors


def spikingjelly_fields(peers: dict, times: dict[str, list[float]], ours_ms: float, batch: int,
                        errors: dict[str, str]) -> dict:
    """The record's SpikingJelly fields: every backend's median, and the fastest one's figures flat beside ours
    (``ratio_spikingjelly_over_ours`` above 1: we are faster)."""
    import statistics

    per_backend = {b: {"median_ms": statistics.median(times[f"sj:{b}"]), "min_ms": min(times[f"sj:{b}"])}
                   for b in peers}
    out: dict = {"spikingjelly_backends": per_backend, "spikingjelly_errors": errors or None}
    if not per_backend:
        out["spikingjelly_error"] = "; ".join(f"{b}: {e}" for b, e in errors.items()) or "no backend"
        return out
    best = min(per_backend, key=lambda b: per_backend[b]["median_ms"])
    ready, ms = peers[best].ready, per_backend[best]["median_ms"]
    out.update(spikingjelly_ms=ms, spikingjelly_min_ms=per_backend[best]["min_ms"],
               spikingjelly_throughput_sps=batch / ms * 1e3, ratio_spikingjelly_over_ours=ms / ours_ms,
               spikingjelly_backend=best, spikingjelly_device=ready["device_name"], spikingjelly_devices=1,
               spikingjelly_batch_size=ready["batch_size"], spikingjelly_loss=ready["loss"],
               spikingjelly_num_params=ready["num_params"], torch_version=ready["torch_version"],
               spikingjelly_version=ready["spikingjelly_version"], torch_threads=ready["torch_threads"],
               torch_interop_threads=ready["torch_interop_threads"], timing="interleaved")
    return out
