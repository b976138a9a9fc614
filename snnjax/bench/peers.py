"""The open SNN library benchmark against every peer that is installed: a layer followed by LIF, forward + backward.

    python -m snnjax.bench.peers --sizes 16/500/1024 64/50/512 16/100/4096 [--workloads linear conv]
        [--impls xla native] [--peers spikingjelly snntorch norse spyx] [--torch-python PY] [--spyx-python PY]
        [--threads N] [--reps 20] [--default-allocator] [--out FILE.jsonl]

The workload (``workload.peer_problem``): ``Linear(N, N)`` (or, ``--workloads conv``, a 3x3 ``Conv2d(N, N)`` with
padding 1 over ``--image-size`` square frames) followed by a LIF neuron over ``[T, B, ...]``; loss = the sum of the
spikes; one timed call computes the spikes and the gradients of the loss with respect to the weight and the input.
Every side gets the same float32 weights, bias and input from numpy. ``--sizes`` lists ``B/T/N``.

Sides: snnjax (``snnjax.layers.linear`` / ``conv2d`` and ``snnjax.neurons.LIFNode``, neuron impl ``auto``; label
``snnjax``) and each of ``--impls`` (``snnjax:xla``, ``snnjax:native``); SpikingJelly, snnTorch and Norse in
processes of ``--torch-python`` (``peers_torch``), spyx in one of ``--spyx-python`` (``peers_spyx``), each written
as its library's documentation writes it and kept alive for the whole run; every side's repetitions interleaved
one by one (``snnjax.bench.peer``). A peer that cannot start, or fails at a size, is recorded unavailable with
its reason. torch gets ``--threads`` threads (default: the cores XLA's CPU pool uses). Every process first calls
``snnjax.runtime.hostmem.keep_freed_memory()``, as ``train.py`` does, unless ``--default-allocator`` (the record's
``host_allocator``): with glibc's defaults each step re-faults the pages of its large buffers.

The neuron is SpikingJelly's ``LIFNode`` defaults (``workload.PEER_LIF``: tau 2, decay_input, hard reset to 0,
threshold 1, Sigmoid(4), reset not detached), which snnjax, SpikingJelly and Norse compute. snnTorch's ``Leaky``
cannot decay its input: it computes SpikingJelly's LIF with ``decay_input=False, detach_reset=True``
(``SNNTORCH_LIF``), and is checked against SpikingJelly run with those. spyx's ``LIF`` (spike read one step late,
threshold subtracted after the decay) is no SpikingJelly neuron: timed, not checked.

Correctness (unless ``--no-check``): each checked side's spikes are compared element by element with SpikingJelly's
(``spike_mismatches``) and its weight and input gradients by relative L2 difference (``kernel_grad_rel_diff``,
``x_grad_rel_diff``). Parts of snnjax's step, timed alone at the same shapes in the same interleaving: the layer's
forward + backward (``linear``; its cotangent the neuron's real input gradient) and the neuron's (``neuron``, per
impl); ``rest`` = step - linear - neuron (the copies and glue between them; negative when XLA overlaps or fuses
them). Each record (one per workload and size; ``--out`` appends it) carries the device kind, versions, thread
counts, load average before and after, every side's median / min ms, the peers' medians over snnjax's
(``ratio_over_snnjax``, above 1: snnjax is faster), the checks and the parts.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from snnjax.bench.common import append_jsonl, git_commit, ready_peers
from snnjax.bench.peer import PeerError, interleave, start_script, thread_info, timed_ms
from snnjax.bench.workload import PEER_LIF, PEER_WORKLOADS, peer_problem

SNNTORCH_LIF = {**PEER_LIF, "decay_input": False, "detach_reset": True}
# library -> (script, interpreter flag, the neuron it computes, whether it is checked against SpikingJelly)
PEERS = {"spikingjelly": ("peers_torch.py", "torch_python", PEER_LIF, True),
         "snntorch": ("peers_torch.py", "torch_python", SNNTORCH_LIF, True),
         "norse": ("peers_torch.py", "torch_python", PEER_LIF, True),
         "spyx": ("peers_spyx.py", "spyx_python", PEER_LIF, False)}
NOT_CHECKED = {"spyx": "spyx's LIF reads its spike from the previous step's potential and subtracts the threshold "
                       "after the decay: no SpikingJelly neuron computes it"}


def parse_size(text: str) -> tuple[int, int, int]:
    """``"B/T/N"`` -> ``(B, T, N)``."""
    parts = text.split("/")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise SystemExit(f"--sizes takes B/T/N with positive integers (e.g. 16/500/1024), got {text!r}")
    return int(parts[0]), int(parts[1]), int(parts[2])


def start_peers(names, args, keep_freed: bool) -> tuple[dict, dict]:
    """``({library: Peer}, {library: error})``, the peers started but not yet waited for."""
    peers, errors = {}, {}
    for name in names:
        script, flag, _, _ = PEERS[name]
        extra = ["--library", name, "--threads", str(args.threads)] if script == "peers_torch.py" else []
        extra += ["--keep-freed-memory"] if keep_freed else []
        try:
            peers[name] = start_script(getattr(args, flag), script, [*extra, "--warmup", str(args.warmup)],
                                       wait=False)
        except OSError as e:
            errors[name] = str(e)
    return peers, errors


class Ours:
    """snnjax's layer + LIF at one size: the jitted step of each impl and its parts."""

    def __init__(self, workload: str, problem: dict, impls, neuron: dict):
        import jax
        import jax.numpy as jnp
        from flax import nnx

        from snnjax import layers, neurons

        n = problem["bias"].shape[0]
        rngs = nnx.Rngs(0)
        layer = layers.conv2d(n, n, 3, padding=1, rngs=rngs) if workload == "conv" else layers.linear(n, n, rngs=rngs)
        layer.kernel[...] = jnp.asarray(problem["kernel"])
        layer.bias[...] = jnp.asarray(problem["bias"])
        self.x = jnp.asarray(problem["x"])
        options = layers.compiler_options(self.x)
        self.steps, self.neuron_steps, self.outputs = {}, {}, {}
        graph_l, self.layer_params = nnx.split(layer)
        apply_layer = lambda p, x: nnx.merge(graph_l, p)(x)  # noqa: E731
        for impl in impls:
            node = neurons.LIFNode(tau=neuron["tau"], decay_input=neuron["decay_input"],
                                   v_threshold=neuron["v_threshold"], v_reset=neuron["v_reset"],
                                   detach_reset=neuron["detach_reset"],
                                   surrogate_function=neurons.Sigmoid(alpha=neuron["sigmoid_alpha"]), step_mode="m",
                                   impl=impl)
            graph_n, rest = nnx.split(node)

            def loss(p, x, graph_n=graph_n, rest=rest):
                spikes = nnx.merge(graph_n, rest)(apply_layer(p, x))
                return jnp.sum(spikes), spikes

            def neuron_grad(i, graph_n=graph_n, rest=rest):
                return jax.grad(lambda i: jnp.sum(nnx.merge(graph_n, rest)(i)))(i)

            self.steps[impl] = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True), compiler_options=options)
            self.neuron_steps[impl] = jax.jit(neuron_grad)
        def linear_step(p, x, ct):  # the layer's forward and backward: its output is returned, so both dots run
            out, pullback = jax.vjp(apply_layer, p, x)
            return out, pullback(ct)

        self.linear_step = jax.jit(linear_step, compiler_options=options)
        currents = jax.jit(apply_layer, compiler_options=options)(self.layer_params, self.x)
        self.currents = jax.block_until_ready(currents)
        self.cotangent = jax.block_until_ready(self.neuron_steps[impls[0]](self.currents))

    def compile(self, warmup: int) -> None:
        """Run every step ``warmup`` times (at least once) and keep each impl's spikes and gradients."""
        import jax

        for _ in range(max(warmup, 1)):
            for impl, step in self.steps.items():
                (grads, x_grad), spikes = jax.block_until_ready(step(self.layer_params, self.x))
                self.outputs[impl] = {"spikes": np.asarray(spikes).astype(np.uint8),
                                      "kernel_grad": np.asarray(grads["kernel"][...]), "x_grad": np.asarray(x_grad)}
                jax.block_until_ready(self.neuron_steps[impl](self.currents))
            jax.block_until_ready(self.linear_step(self.layer_params, self.x, self.cotangent))

    def timers(self) -> dict:
        """``{label: () -> ms}``: each impl's step and neuron, and the layer."""
        import jax

        def timer(fn, *a):
            return lambda: timed_ms(lambda: jax.block_until_ready(fn(*a)))

        out = {("snnjax" if impl == "auto" else f"snnjax:{impl}"): timer(step, self.layer_params, self.x)
               for impl, step in self.steps.items()}
        out["part:linear"] = timer(self.linear_step, self.layer_params, self.x, self.cotangent)
        out.update({f"part:neuron:{impl}": timer(fn, self.currents) for impl, fn in self.neuron_steps.items()})
        return out


def compare(got: dict, ref: dict) -> dict:
    """Spike mismatches and gradients' relative L2 differences of ``got`` against ``ref`` (SpikingJelly's)."""
    def rel(key):
        return float(np.linalg.norm((got[key] - ref[key]).ravel()) / max(np.linalg.norm(ref[key].ravel()), 1e-30))

    return {"spike_mismatches": int(np.sum(got["spikes"] != ref["spikes"])), "spikes": int(got["spikes"].sum()),
            "reference_spikes": int(ref["spikes"].sum()), "kernel_grad_rel_diff": rel("kernel_grad"),
            "x_grad_rel_diff": rel("x_grad")}


def load(path: str) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def run_size(workload: str, size, args, peers: dict, unavailable: dict, impls, device, tmp: str,
             host_allocator: str) -> dict:
    """Set up every side at one workload and size, check, time interleaved; return the record."""
    import jax

    b, t, n = size
    load_before = os.getloadavg()
    problem = peer_problem(workload, t, b, n, args.image_size)
    ours = Ours(workload, problem, impls, PEER_LIF)
    ours.compile(args.warmup)
    live_peers, _ = ready_peers(peers, unavailable)  # waits only the first time: they started while ours compiled
    peers.clear()
    peers.update(live_peers)
    request = {"workload": workload, "T": t, "B": b, "N": n, "image_size": args.image_size}
    refs, dumps, live = {}, {}, {}
    check = not args.no_check and "spikingjelly" in peers
    if check and "snntorch" in peers:  # SpikingJelly computing snnTorch's neuron, for its check
        try:
            peers["spikingjelly"].request("setup", **request, neuron=SNNTORCH_LIF, dump=os.path.join(tmp, "ref2.npz"))
            refs["snntorch"] = load(os.path.join(tmp, "ref2.npz"))
        except PeerError as e:
            print(f"  spikingjelly with snnTorch's neuron: {e}", flush=True)
    for name in sorted(peers, key=lambda k: k == "spikingjelly"):  # SpikingJelly last: it keeps the timed setup
        dumps[name] = os.path.join(tmp, f"{name}.npz") if check and PEERS[name][3] else None
        try:
            peers[name].request("setup", **request, neuron=PEERS[name][2], dump=dumps[name])
            live[name] = peers[name]
        except (PeerError, OSError) as e:  # OSError: the peer's process has gone
            unavailable[name] = f"{workload} {b}/{t}/{n}: {e}"
            print(f"  {name}: unavailable at this size ({e})", flush=True)
    checks = {}
    if check and "spikingjelly" in live:
        refs["spikingjelly"] = load(dumps["spikingjelly"])
        for impl, out in ours.outputs.items():
            checks["snnjax" if impl == "auto" else f"snnjax:{impl}"] = compare(out, refs["spikingjelly"])
        for name in live:
            if name == "spikingjelly":
                continue
            if not PEERS[name][3]:
                checks[name] = {"checked": False, "why": NOT_CHECKED[name]}
            elif name in refs or name != "snntorch":
                ref = refs["snntorch"] if name == "snntorch" else refs["spikingjelly"]
                checks[name] = {**compare(load(dumps[name]), ref), "neuron": PEERS[name][2]}
    timers = ours.timers()
    timers.update({name: peer.time_once for name, peer in live.items()})
    times = interleave(timers, args.reps)
    stats = {k: {"median_ms": statistics.median(v), "min_ms": min(v)} for k, v in times.items()}
    ours_ms = stats["snnjax"]["median_ms"]
    results = {k: v for k, v in stats.items() if not k.startswith("part:")}
    parts = {}
    for impl in impls:
        label = "snnjax" if impl == "auto" else f"snnjax:{impl}"
        step_ms = stats[label]["median_ms"]
        lin, neu = stats["part:linear"]["median_ms"], stats[f"part:neuron:{impl}"]["median_ms"]
        parts[label] = {"step_ms": step_ms, "linear_ms": lin, "neuron_ms": neu, "rest_ms": step_ms - lin - neu,
                        "linear_share": lin / step_ms, "neuron_share": neu / step_ms,
                        "rest_share": (step_ms - lin - neu) / step_ms}
    return {
        "bench": "peers", "workload": workload, "B": b, "T": t, "N": n,
        "image_size": args.image_size if workload == "conv" else None, "x_shape": list(problem["x"].shape),
        "dtype": "float32", "neuron": PEER_LIF, "device_kind": device.device_kind, "platform": device.platform,
        "jax_version": jax.__version__, "commit": git_commit(), "threads": thread_info(),
        "load_avg_before": list(load_before), "load_avg_after": list(os.getloadavg()), "reps": args.reps,
        "warmup": args.warmup, "timing": "interleaved", "host_allocator": host_allocator, "results": results,
        "ratio_over_snnjax": {k: v["median_ms"] / ours_ms for k, v in results.items() if k != "snnjax"},
        "parts": parts, "check": checks or None,
        "peers": {name: {**peers[name].ready, "neuron": PEERS[name][2]} for name in live},
        "unavailable": dict(unavailable) or None, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def print_record(rec: dict) -> None:
    print(f"{rec['workload']} B={rec['B']} T={rec['T']} N={rec['N']}: median ms (min), peer / snnjax; load "
          f"{rec['load_avg_before'][0]:.1f} -> {rec['load_avg_after'][0]:.1f}", flush=True)
    for name, r in rec["results"].items():
        ratio = rec["ratio_over_snnjax"].get(name)
        c = (rec["check"] or {}).get(name, {})
        check = (f"spikes {c['spike_mismatches']} off, dW {c['kernel_grad_rel_diff']:.1e}, dX "
                 f"{c['x_grad_rel_diff']:.1e}" if "spike_mismatches" in c else "not checked" if c else
                 "the reference" if name == "spikingjelly" and rec["check"] else "")
        print(f"  {name:<16} {r['median_ms']:>10.2f} ({r['min_ms']:.2f}) "
              f"{'' if ratio is None else f'{ratio:5.2f}x':>6}  {check}", flush=True)
    for label, p in rec["parts"].items():
        print(f"  {label} parts: linear {p['linear_ms']:.2f} ms ({p['linear_share']:.0%}), neuron "
              f"{p['neuron_ms']:.2f} ms ({p['neuron_share']:.0%}), rest {p['rest_ms']:.2f} ms "
              f"({p['rest_share']:.0%})", flush=True)
    for name, why in (rec["unavailable"] or {}).items():
        print(f"  {name}: unavailable ({why})", flush=True)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=["16/500/1024"], help="B/T/N triples (default 16/500/1024)")
    p.add_argument("--workloads", nargs="+", default=["linear"], choices=PEER_WORKLOADS)
    p.add_argument("--image-size", type=int, default=16, help="the conv workload's frame side (default 16)")
    p.add_argument("--impls", nargs="*", default=[], help="snnjax neuron impls timed beside auto (xla, native, ...)")
    p.add_argument("--peers", nargs="*", default=list(PEERS), choices=list(PEERS))
    p.add_argument("--torch-python", default=sys.executable,
                   help="interpreter with torch and SpikingJelly / snnTorch / Norse (default: this one)")
    p.add_argument("--spyx-python", default=sys.executable, help="interpreter with spyx (default: this one)")
    p.add_argument("--threads", type=int, default=thread_info()["schedulable_cores"],
                   help="torch.set_num_threads in the torch peers (default: the cores XLA's CPU pool uses)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--no-check", action="store_true", help="skip the correctness check against SpikingJelly")
    p.add_argument("--default-allocator", action="store_true",
                   help="leave glibc's malloc alone (default: snnjax.runtime.hostmem.keep_freed_memory, as train.py "
                        "does, in this process and every peer's)")
    p.add_argument("--out", help="append one JSON line per workload and size to this file")
    args = p.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes]
    from snnjax.neurons import IMPLS

    bad = [i for i in args.impls if i not in IMPLS]
    if bad:
        raise SystemExit(f"--impls takes {', '.join(IMPLS)}; got {bad}")
    impls = ["auto", *dict.fromkeys(i for i in args.impls if i != "auto")]

    from snnjax.runtime import hostmem

    keep_freed = not args.default_allocator and hostmem.keep_freed_memory()  # before XLA starts its threads
    peers, unavailable = start_peers(args.peers, args, keep_freed)  # they start while ours compiles
    import jax

    device = jax.devices()[0]
    records = []
    try:
        with tempfile.TemporaryDirectory(prefix="snnjax-peers-") as tmp:
            for workload in args.workloads:
                for size in sizes:
                    rec = run_size(workload, size, args, peers, unavailable, impls, device, tmp,
                                   "keep_freed_memory" if keep_freed else "default")
                    print_record(rec)
                    append_jsonl(args.out, rec)
                    records.append(rec)
    finally:
        for peer in peers.values():
            peer.close()
    return records


if __name__ == "__main__":
    main()
