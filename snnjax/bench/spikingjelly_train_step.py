"""Times SpikingJelly's own model's training step for ``snnjax.bench.train_step``; needs torch and spikingjelly.

    python snnjax/bench/spikingjelly_train_step.py --model cifar10dvs_vgg --T 4 --batch BATCH.npz

Models (float32, torch CPU, ``--threads`` threads, multi-step mode, neuron backend ``torch``):
``cifar10dvs_vgg``: ``spikingjelly.activation_based.examples.memopt.models.CIFAR10DVSVGG`` on
``[N, T, 2, 48, 48]``; ``spikformer_ti``: ``model.spikformer.Spikformer`` (256 dims, depth 4, 8
heads, 10 classes) on ``[N, 3, 32, 32]`` images it repeats T times; ``mlp``: Linear 64 -> 256, LIF,
Linear 256 -> 10. The inputs are ``snnjax.bench.train_step.make_batch``'s (``--batch``: an ``.npz`` with
``inputs [T, N, ...]`` and ``labels [N]``), transposed. One step:
``reset_net``, forward, cross-entropy of the time-mean logits, ``zero_grad``, backward, Adam step.
Prints one JSON line: median / min milliseconds, the first loss, the parameter count. Kept free of JAX
and run as a script, not a module: importing the ``snnjax`` package would import JAX.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def build(model: str, t: int):
    """``(torch model, input converter from our [T, N, ...] numpy batch)``."""
    import torch
    from spikingjelly.activation_based import functional, layer, neuron, surrogate

    if model == "cifar10dvs_vgg":
        from spikingjelly.activation_based.examples.memopt.models import CIFAR10DVSVGG

        return CIFAR10DVSVGG(), lambda x: torch.from_numpy(np.ascontiguousarray(x.transpose(1, 0, 4, 2, 3)))
    if model == "spikformer_ti":
        from spikingjelly.activation_based.model import spikformer as sf

        net = sf.Spikformer(T=t, in_channels=3, img_size_h=32, img_size_w=32, num_classes=10, embed_dims=256,
                            num_heads=8, depths=4, mlp_ratio=4.0)
        return net, lambda x: torch.from_numpy(np.ascontiguousarray(x[0].transpose(0, 3, 1, 2)))
    net = torch.nn.Sequential(layer.Linear(64, 256), neuron.LIFNode(tau=2.0, detach_reset=True,
                                                                    surrogate_function=surrogate.Sigmoid()),
                              layer.Linear(256, 10))
    functional.set_step_mode(net, "m")
    return net, lambda x: torch.from_numpy(x)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch", required=True, help=".npz with inputs [T, N, ...] and labels [N]")
    p.add_argument("--T", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)

    import torch
    from spikingjelly.activation_based import functional, neuron

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    net, convert = build(args.model, args.T)
    for m in net.modules():  # the default already; the only neuron backend on a CPU
        if isinstance(m, neuron.BaseNode):
            m.backend = "torch"
    net.train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    with np.load(args.batch) as data:
        x_np, y_np = data["inputs"], data["labels"]
    x, y = convert(x_np), torch.from_numpy(y_np).long()

    def step() -> float:
        functional.reset_net(net)
        logits = net(x)  # [T, N, classes]
        loss = torch.nn.functional.cross_entropy(logits.mean(0), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss)

    first_loss = step()
    for _ in range(max(args.warmup - 1, 0)):
        step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    print(json.dumps({"model": args.model, "median_ms": statistics.median(times), "min_ms": min(times),
                      "loss": first_loss, "num_params": sum(p.numel() for p in net.parameters()),
                      "torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)


if __name__ == "__main__":
    main()
