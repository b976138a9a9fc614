"""The torch libraries' side of ``snnjax.bench.peers``: SpikingJelly, snnTorch or Norse, one per process.

    python snnjax/bench/peers_torch.py --library snntorch --threads 2

A peer (``snnjax.bench.peer``) that builds the benchmark's layer + LIF the way the library's documentation writes
it: SpikingJelly ``layer.Linear`` / ``layer.Conv2d`` and ``neuron.LIFNode`` in multi-step mode over ``[T, B, ...]``;
snnTorch an ``nn.Linear`` / ``nn.Conv2d`` and ``snn.Leaky`` called step by step in a loop over T; Norse
``SequentialState(nn.Linear, LIF)`` (the convolution wrapped in ``Lift``). Requests:

- ``{"op": "setup", "workload", "T", "B", "N", "image_size", "neuron", "dump"}`` builds the model with the weights
  and input of ``workload.peer_problem``, and the neuron ``neuron`` (``workload.PEER_LIF``'s keys, SpikingJelly's
  terms) in the library's own parameters, or answers an error naming what the library cannot compute; warms up;
  with ``dump`` a path, saves ``spikes``, ``kernel_grad`` and ``x_grad`` there (``.npz``, snnjax's layouts);
- ``{"op": "time"}``: one forward + backward (loss = the spike sum; gradients of the weight and the input).

Run as a script, never with JAX: it imports its siblings ``peer`` and ``workload`` directly.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata

import numpy as np

if __package__:  # imported as snnjax.bench.peers_torch
    from snnjax.bench import peer, workload
else:  # run as a script: its folder is sys.path[0], and the snnjax package (which imports JAX) stays out
    import peer
    import workload

LIBRARIES = {"spikingjelly": "spikingjelly", "snntorch": "snntorch", "norse": "norse"}  # name -> distribution


def to_torch_layout(name: str, a: np.ndarray, conv: bool) -> np.ndarray:
    """snnjax's layouts to torch's: x ``[T, B, H, W, C] -> [T, B, C, H, W]``; kernel ``HWIO -> OIHW`` or
    ``[in, out] -> [out, in]``."""
    if name == "kernel":
        return a.transpose(3, 2, 0, 1) if conv else a.T
    return a.transpose(0, 1, 4, 2, 3) if conv and name == "x" else a


def from_torch_layout(name: str, a: np.ndarray, conv: bool) -> np.ndarray:
    """The inverse of ``to_torch_layout`` (spikes and x share x's layout)."""
    if name == "kernel":
        return a.transpose(2, 3, 1, 0) if conv else a.T
    return a.transpose(0, 1, 3, 4, 2) if conv else a


def build(library: str, conv: bool, n: int, neuron: dict):
    """``(model, forward)``: ``forward(x)`` gives the spikes of ``x`` (torch layout) from a fresh state."""
    import torch
    from torch import nn

    tau, alpha = neuron["tau"], neuron["sigmoid_alpha"]
    if library == "spikingjelly":
        from spikingjelly.activation_based import functional, layer, surrogate
        from spikingjelly.activation_based import neuron as sj_neuron

        model = nn.Sequential(
            layer.Conv2d(n, n, 3, padding=1, step_mode="m") if conv else layer.Linear(n, n, step_mode="m"),
            sj_neuron.LIFNode(tau=tau, decay_input=neuron["decay_input"], v_threshold=neuron["v_threshold"],
                              v_reset=neuron["v_reset"], detach_reset=neuron["detach_reset"],
                              surrogate_function=surrogate.Sigmoid(alpha=alpha), step_mode="m"))

        def forward(x):
            functional.reset_net(model)
            return model(x)

        return model, forward
    if library == "snntorch":
        # Leaky: U[t] = beta U[t-1] (1 - S[t-1]) + I[t] with the reset detached, reset to zero: SpikingJelly's LIF
        # without decay_input, detach_reset, v_reset 0, beta = 1 - 1/tau; its sigmoid(slope) is Sigmoid(alpha).
        if neuron["decay_input"] or not neuron["detach_reset"] or neuron["v_reset"] != 0.0:
            raise ValueError("snnTorch's Leaky computes SpikingJelly's LIF with decay_input=False, detach_reset=True, "
                             f"v_reset=0 only; asked for {neuron}")
        import snntorch as snn
        from snntorch import surrogate

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Conv2d(n, n, 3, padding=1) if conv else nn.Linear(n, n)
                self.lif = snn.Leaky(beta=1.0 - 1.0 / tau, threshold=neuron["v_threshold"], reset_mechanism="zero",
                                     spike_grad=surrogate.sigmoid(slope=alpha))

            def forward(self, x):
                mem = self.lif.reset_mem()
                spikes = []
                for x_t in x:
                    spk, mem = self.lif(self.fc(x_t), mem)
                    spikes.append(spk)
                return torch.stack(spikes)

        model = Net()
        return model, model
    if library == "norse":
        # LIF with dt * tau_syn_inv = 1 (the synaptic current is the step's input alone) and dt * tau_mem_inv = 1/tau:
        # SpikingJelly's LIF with decay_input, its reset not detached. Surrogate "tanh" with k has the gradient
        # 1 - tanh(k x)^2 = 4 s (1 - s), s = sigmoid(2 k x): Sigmoid(alpha)'s alpha s (1 - s) for alpha = 4, k = 2 only.
        if not neuron["decay_input"] or neuron["detach_reset"] or alpha != 4.0:
            raise ValueError("Norse's LIF computes SpikingJelly's LIF with decay_input=True, detach_reset=False, "
                             f"Sigmoid(alpha=4) only; asked for {neuron}")
        import norse.torch as norse

        dt = 1e-3
        p = norse.LIFParameters(tau_syn_inv=torch.as_tensor(1.0 / dt), tau_mem_inv=torch.as_tensor(1.0 / (tau * dt)),
                                v_leak=torch.as_tensor(0.0), v_th=torch.as_tensor(neuron["v_threshold"]),
                                v_reset=torch.as_tensor(neuron["v_reset"]), method="tanh", alpha=2.0)
        layer = norse.Lift(nn.Conv2d(n, n, 3, padding=1)) if conv else nn.Linear(n, n)
        model = norse.SequentialState(layer, norse.LIF(p, dt=dt))
        return model, lambda x: model(x)[0]
    raise ValueError(f"library must be one of {', '.join(LIBRARIES)}, got {library!r}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--library", required=True, choices=list(LIBRARIES))
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--keep-freed-memory", action="store_true", help="snnjax.runtime.hostmem.keep_freed_memory() first")
    args = p.parse_args(argv)
    if args.keep_freed_memory:
        peer.keep_freed_memory()

    import torch

    importlib.import_module(args.library)  # a missing library fails the start, with its ImportError as the reason
    if args.threads:
        torch.set_num_threads(args.threads)
    held = {}

    def step():
        model, forward, x = held["model"], held["forward"], held["x"]
        x.grad = None
        model.zero_grad(set_to_none=True)
        spikes = forward(x)
        spikes.sum().backward()
        return spikes

    def setup(request: dict) -> dict:
        held.clear()
        conv = request["workload"] == "conv"
        problem = workload.peer_problem(request["workload"], request["T"], request["B"], request["N"],
                                        request["image_size"])
        model, forward = build(args.library, conv, request["N"], request["neuron"])
        layer = next(m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)))
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(to_torch_layout("kernel", problem["kernel"], conv).copy()))
            layer.bias.copy_(torch.from_numpy(problem["bias"]))
        x = torch.from_numpy(to_torch_layout("x", problem["x"], conv).copy()).requires_grad_(True)
        held.update(model=model, forward=forward, x=x, layer=layer)
        for _ in range(max(args.warmup, 1)):
            spikes = step()
        if request.get("dump"):
            np.savez(request["dump"],
                     spikes=from_torch_layout("x", spikes.detach().numpy(), conv).astype(np.uint8),
                     kernel_grad=from_torch_layout("kernel", layer.weight.grad.numpy(), conv),
                     x_grad=from_torch_layout("x", x.grad.numpy(), conv))
        return {"spikes": float(spikes.detach().double().sum())}

    ready = {"library": args.library, "version": importlib.metadata.version(LIBRARIES[args.library]),
             "torch_version": torch.__version__, "torch_threads": torch.get_num_threads(),
             "torch_interop_threads": torch.get_num_interop_threads(), "threads": peer.thread_info()}
    peer.serve({"setup": setup, "time": lambda _request: {"ms": peer.timed_ms(step)}}, ready)


if __name__ == "__main__":
    main()
