"""SpikingJelly's side of the neuron benchmark (``snnjax.bench.neuron``): multi-step LIF / PLIF / catalogue neuron
forward + backward.

    SJ_LIF_CUDA_IMPLEMENTATION=triton python snnjax/bench/spikingjelly_lif.py --device cuda --backend triton

A peer (``snnjax.bench.peer``) running ``LIFNode(step_mode='m')`` with its defaults (tau 2, Sigmoid(4), hard
reset to 0), or ``ParametricLIFNode(init_tau=2.0)`` (``--neuron PLIF``; its ``w.grad`` is answered too), or
SpikingJelly's class ``--neuron NAME`` of ``workload.CATALOGUE_NEURONS`` with its defaults and
``workload.CATALOGUE_KEYWORDS`` (built at each setup: GatedLIFNode takes the T; its parameters' gradient sums are
answered too).
Requests: ``{"op": "setup", "T": t}`` builds the inputs of ``workload.lif_inputs`` (the numbers ours get), warms
up and answers the spike count and the gradient's L2 norm; ``{"op": "time"}`` computes the spikes and ``x.grad``
for the cotangent dS ``--inner`` times (one device sync at the end) and answers the milliseconds per call. On a
GPU, SpikingJelly picks its CUDA implementation from the environment variable ``SJ_LIF_CUDA_IMPLEMENTATION`` /
``SJ_PLIF_CUDA_IMPLEMENTATION`` (auto, cuda, triton, torch): one peer per backend. Run as a script, never with
JAX: it imports its siblings ``peer`` and ``workload`` directly.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os

if __package__:  # imported as snnjax.bench.spikingjelly_lif
    from snnjax.bench import peer, workload
else:  # run as a script: its folder is sys.path[0], and the snnjax package (which imports JAX) stays out
    import peer
    import workload


def run(torch, functional, node, x, ds):
    """One training-shaped call: fresh state, spikes of ``x``, ``x.grad`` for the cotangent ``ds``."""
    functional.reset_net(node)
    x.grad = None
    node.zero_grad(set_to_none=True)
    spikes = node(x)
    spikes = torch.stack(spikes) if isinstance(spikes, list) else spikes  # the non-spiking readouts return a list
    spikes.backward(ds)
    return spikes


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="cpu", help="label for the records (cpu, triton, cuda, torch)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--features", type=int, default=16384)
    p.add_argument("--neuron", default="LIF", choices=["LIF", "PLIF", *workload.CATALOGUE_NEURONS])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--inner", type=int, default=1, help="calls per timed repetition (one sync at its end)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--keep-freed-memory", action="store_true", help="snnjax.runtime.hostmem.keep_freed_memory() first")
    args = p.parse_args(argv)
    if args.keep_freed_memory:
        peer.keep_freed_memory()

    import torch
    from spikingjelly.activation_based import functional, neuron

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    catalogue = args.neuron in workload.CATALOGUE_NEURONS

    def build(t: int):
        if args.neuron in ("LIF", "PLIF"):
            return (neuron.ParametricLIFNode(init_tau=2.0, step_mode="m") if args.neuron == "PLIF"
                    else neuron.LIFNode(tau=2.0, step_mode="m")).to(dev)
        kwargs = dict(workload.CATALOGUE_KEYWORDS.get(args.neuron, {}))
        if "act" in kwargs:
            kwargs["act"] = getattr(torch, kwargs["act"])
        if args.neuron == "GatedLIFNode":
            kwargs["T"] = t
        m = getattr(neuron, args.neuron)(**kwargs)
        if not args.neuron.startswith("NonSpiking") and args.neuron != "GatedLIFNode":  # those two: multi-step only
            m.step_mode = "m"
        if args.neuron == "LIAFNode":  # else its multi-step call takes LIFNode's fused path: spikes, not act(H)
            m.store_v_seq = True
        return m.to(dev, dtype)

    node = build(1)
    held = {}

    def setup(request: dict) -> dict:
        nonlocal node
        held.clear()
        if catalogue:
            node = build(request["T"])
        x_np, ds_np = workload.lif_inputs(request["T"], args.batch, args.features)
        if args.neuron == "GatedLIFNode":  # its scalar gates broadcast over steps [N, C, H, W]: C features as [C, 1, 1]
            x_np, ds_np = x_np[..., None, None], ds_np[..., None, None]
        x = torch.from_numpy(x_np).to(dev, dtype).requires_grad_(True)
        ds = torch.from_numpy(ds_np).to(dev, dtype)
        for _ in range(max(args.warmup, 1)):
            spikes = run(torch, functional, node, x, ds)
        sync()
        held.update(x=x, ds=ds)
        out = {"spikes": float(spikes.detach().double().sum()), "dx_norm": float(x.grad.double().norm())}
        if catalogue:
            out["dparams"] = {name: float(prm.grad.double().sum()) for name, prm in node.named_parameters()}
        return {**out, "dw": float(node.w.grad)} if args.neuron == "PLIF" else out

    def timed(_request: dict) -> dict:
        def calls():
            for _ in range(args.inner):
                run(torch, functional, node, held["x"], held["ds"])
            sync()

        return {"ms": peer.timed_ms(calls) / args.inner}

    ready = {"backend": args.backend, "device": args.device, "inner": args.inner, "torch_version": torch.__version__,
             "spikingjelly_version": importlib.metadata.version("spikingjelly"),
             "implementation": os.environ.get(f"SJ_{args.neuron}_CUDA_IMPLEMENTATION", "auto"), "neuron": args.neuron,
             "torch_threads": torch.get_num_threads(), "keep_freed_memory": args.keep_freed_memory}
    peer.serve({"setup": setup, "time": timed}, ready)


if __name__ == "__main__":
    main()
