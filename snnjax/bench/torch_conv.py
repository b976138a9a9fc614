"""torch's side of the convolution benchmark (``snnjax.bench.conv``): one 2-D convolution's forward, input gradient
and kernel gradient.

    python snnjax/bench/torch_conv.py --format channels_last --threads 2

A peer (``snnjax.bench.peer``). Requests: ``{"op": "setup", "x": [N, H, W, C_in], "w": [kh, kw, C_in, C_out],
"strides": [sh, sw], "padding": [[top, bottom], [left, right]]}`` (the shapes as ours, NHWC / HWIO) builds the
input, kernel and cotangent in ``--format`` (``contiguous``: NCHW, ``channels_last``: NHWC in memory), warms each
part up and answers the output shape; ``{"op": "time", "part": "forward" | "input_grad" | "kernel_grad"}`` runs that
part once and answers ``ms`` (wall) and ``cpu_ms`` (this process's CPU time). The forward is ``F.conv2d``; the
gradients are ``torch.nn.grad.conv2d_input`` / ``conv2d_weight`` (the kernels autograd calls). Run as a script,
never with JAX: it imports its sibling ``peer`` directly.
"""
from __future__ import annotations

import argparse
import time

if __package__:  # imported as snnjax.bench.torch_conv
    from snnjax.bench import peer
else:  # run as a script: its folder is sys.path[0], and the snnjax package (which imports JAX) stays out
    import peer


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--format", default="contiguous", choices=["contiguous", "channels_last"])
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)

    import torch
    import torch.nn.functional as F

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    memory_format = torch.channels_last if args.format == "channels_last" else torch.contiguous_format
    parts = {}

    def setup(req):
        n, h, w, ci = req["x"]
        kh, kw, _, co = req["w"]
        (pt, pb), (pl, pr) = req["padding"]
        if (pt, pl) != (pb, pr):
            raise ValueError(f"torch's conv2d pads both sides alike; got padding {req['padding']}")
        stride, padding = tuple(req["strides"]), (pt, pl)
        x = torch.randn(n, ci, h, w).to(memory_format=memory_format)
        k = torch.randn(co, ci, kh, kw).to(memory_format=memory_format) * 0.1
        g = torch.randn_like(F.conv2d(x, k, stride=stride, padding=padding))
        parts.clear()
        parts["forward"] = lambda: F.conv2d(x, k, stride=stride, padding=padding)
        parts["input_grad"] = lambda: torch.nn.grad.conv2d_input(x.shape, k, g, stride=stride, padding=padding)
        parts["kernel_grad"] = lambda: torch.nn.grad.conv2d_weight(x, k.shape, g, stride=stride, padding=padding)
        for fn in parts.values():
            for _ in range(args.warmup):
                fn()
        return {"y": list(g.shape)}

    def timed(req):
        fn = parts[req["part"]]
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        return {"ms": (time.perf_counter() - wall) * 1e3, "cpu_ms": (time.process_time() - cpu) * 1e3}

    ready = {"torch": torch.__version__, "threads": torch.get_num_threads(), "format": args.format,
             "mkldnn": torch.backends.mkldnn.is_available(), **peer.thread_info()}
    peer.serve({"setup": setup, "time": timed}, ready)


if __name__ == "__main__":
    main()
