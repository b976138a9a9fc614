"""SpikingJelly's side of the train-step comparisons (``snnjax.bench.train_step``, ``snnjax.bench.distributed``).

    python snnjax/bench/spikingjelly_train_step.py --model cifar10dvs_vgg --T 4 --batch-size 8 [--width-div K]
        [--image-size P] [--device cpu|cuda] [--backend torch|triton|cuda|auto] [--dtype float32|bfloat16]
        [--threads N] [--warmup W]

A peer (``snnjax.bench.peer``): it builds the model, warms up, prints its ``ready`` line (versions, threads,
backend, parameter count, first loss) and then runs one timed step per ``time`` request. ``--backend`` on CUDA
sets every neuron's ``SJ_<NEURON>_CUDA_IMPLEMENTATION`` (SpikingJelly 2.0.0 picks its neuron kernels from these
when it is imported; ``auto`` prefers ``cuda``, then ``triton``); on a CPU only ``torch`` exists.
``--dtype bfloat16`` runs forward and loss under ``torch.autocast(dtype=torch.bfloat16)``. Needs torch and
spikingjelly, never JAX: it is run as a script and imports its siblings ``peer`` and ``workload`` directly.

Models (float32, multi-step mode, the architecture of ``workload.architecture``): ``cifar10dvs_vgg``:
``spikingjelly.activation_based.examples.memopt.models.CIFAR10DVSVGG`` at full size, else the same stack of
its ``VGGBlock``s with the divided widths; ``spikformer_ti``: ``model.spikformer.Spikformer`` on
``[N, 3, P, P]`` images it repeats T times; ``mlp``: Linear, LIF, Linear; ``sdt`` / ``qkformer``:
``model.spike_driven_transformer.SpikeDrivenTransformer`` / ``model.qkformer.QKFormer`` likewise (they
return the time-mean logits); ``sew_resnet18``, ``spiking_resnet18``: ``model.sew_resnet`` /
``model.spiking_resnet`` with the stem and head resized; ``dvsgesture_plif``:
``model.parametric_lif_net.DVSGestureNet``; ``ms_resnet18``: ``model.ms_resnet.MSResNet`` (``ms_resnet18``'s
architecture, ``base_channels`` as given) on ``[N, 3, P, P]`` images it repeats T times. Inputs are
``workload.make_batch``'s, transposed to SpikingJelly's layout. One step: ``reset_net``, forward, cross-entropy
of the time-mean logits, ``zero_grad``, backward, ``torch.optim.Adam`` (lr 1e-3); on CUDA it ends with
``torch.cuda.synchronize``.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os

import numpy as np

if __package__:  # imported as snnjax.bench.spikingjelly_train_step
    from snnjax.bench import peer, workload
else:  # run as a script: its folder is sys.path[0], and the snnjax package (which imports JAX) stays out
    import peer
    import workload

# SpikingJelly 2.0.0's neurons with selectable CUDA implementations (its ``_ops`` packages)
NEURON_IMPLEMENTATIONS = ("IF", "LIF", "PLIF", "QIF", "EIF", "IZHIKEVICH", "ILIF", "CLIF", "STBIF",
                          "ACTIVATION_AWARE_IF")


def _vgg(arch: dict):
    """SpikingJelly's CIFAR10DVSVGG, or the same stack of its blocks for other widths / frame sizes."""
    import torch
    from spikingjelly.activation_based import functional, layer, surrogate
    from spikingjelly.activation_based.examples.memopt.models import CIFAR10DVSVGG, VGGBlock

    if arch["widths"] == workload.VGG_WIDTHS and arch["image_size"] == 48:
        return CIFAR10DVSVGG()
    kw = dict(tau=1.333, decay_input=False, detach_reset=True, surrogate_function=surrogate.ATan(), step_mode="m")
    blocks, cin = [], arch["in_channels"]
    for w, pool in zip(arch["widths"], arch["pools"], strict=True):
        blocks.append(VGGBlock(cin, w, 3, 1, 1, pool, **kw))
        cin = w
    side = arch["image_size"] // 2 ** (sum(arch["pools"]) + 1)
    features = torch.nn.Sequential(*blocks, layer.AvgPool2d(2))
    classifier = torch.nn.Sequential(torch.nn.Dropout(0.25), torch.nn.Linear(cin * side * side, arch["num_classes"]))

    class VGG(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.features, self.classifier = features, classifier
            functional.set_step_mode(self, "m")

        def forward(self, x):  # [N, T, C, H, W], as CIFAR10DVSVGG takes it
            x = self.features(x.transpose(0, 1).contiguous())
            return self.classifier(torch.flatten(x, 2))

    return VGG()


def _stub_torchvision() -> None:
    """SpikingJelly's ResNet modules import torchvision only for pretrained downloads; where the installed
    torchvision's compiled ops do not match torch (or it is absent), stand-in modules take its place."""
    import sys
    import types

    try:
        import torchvision.models  # noqa: F401
        return
    except (ImportError, RuntimeError):  # a torchvision built for another torch raises RuntimeError
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]

    def no_download(*args, **kwargs):
        raise RuntimeError("pretrained weights are not used here")

    for name in ("torchvision", "torchvision.models", "torchvision.models.utils"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["torchvision.models.utils"].load_state_dict_from_url = no_download


def _zoo(model: str, arch: dict):
    """SpikingJelly's SEW-ResNet-18 / Spiking ResNet-18 (stem for ``in_channels``, head for ``num_classes``) or
    DVSGestureNet, multi-step, ATan surrogate and ``detach_reset``; inputs ``[T, N, C, H, W]``."""
    from spikingjelly.activation_based import functional, layer, neuron, surrogate

    cls = {"IF": neuron.IFNode, "PLIF": neuron.ParametricLIFNode}[arch["spiking_neuron"]]
    kw = dict(spiking_neuron=cls, surrogate_function=surrogate.ATan(), detach_reset=True)
    if model == "dvsgesture_plif":
        from spikingjelly.activation_based.model import parametric_lif_net as pln

        if arch["image_size"] != 128 or arch["hidden_features"] != 512:
            raise ValueError("SpikingJelly's DVSGestureNet is fixed to 128 x 128 frames and 512 hidden neurons")
        net = pln.DVSGestureNet(channels=arch["channels"], **kw)
    else:
        if arch["widths"] != (64, 128, 256, 512):
            raise ValueError("SpikingJelly's ResNets have fixed widths: use --width-div 1")
        _stub_torchvision()
        if model == "sew_resnet18":
            from spikingjelly.activation_based.model import sew_resnet

            net = sew_resnet.sew_resnet18(cnf=arch["cnf"], **kw)
        else:
            from spikingjelly.activation_based.model import spiking_resnet

            net = spiking_resnet.spiking_resnet18(**kw)
        net.conv1 = layer.Conv2d(arch["in_channels"], 64, kernel_size=7, stride=2, padding=3, bias=False)
        net.fc = layer.Linear(512, arch["num_classes"])
    functional.set_step_mode(net, "m")
    return net


def build(model: str, arch: dict):
    """``(torch model, converter from our [T, N, ...] numpy batch to its input)``."""
    import torch
    from spikingjelly.activation_based import functional, layer, neuron, surrogate

    if model in ("sew_resnet18", "spiking_resnet18", "dvsgesture_plif"):
        return _zoo(model, arch), lambda x: torch.from_numpy(np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3)))

    if model == "cifar10dvs_vgg":
        return _vgg(arch), lambda x: torch.from_numpy(np.ascontiguousarray(x.transpose(1, 0, 4, 2, 3)))
    if model == "spikformer_ti":
        from spikingjelly.activation_based.model import spikformer as sf

        net = sf.Spikformer(T=arch["T"], in_channels=arch["in_channels"], img_size_h=arch["img_size_h"],
                            img_size_w=arch["img_size_w"], num_classes=arch["num_classes"],
                            embed_dims=arch["embed_dims"], num_heads=arch["num_heads"], depths=arch["depths"],
                            mlp_ratio=arch["mlp_ratio"])
        return net, lambda x: torch.from_numpy(np.ascontiguousarray(x[0].transpose(0, 3, 1, 2)))
    if model == "ms_resnet18":  # SpikingJelly's MSResNet takes [N, C, H, W] and repeats it T times
        from spikingjelly.activation_based.model.ms_resnet import MSResNet

        return MSResNet(**arch), lambda x: torch.from_numpy(np.ascontiguousarray(x[0].transpose(0, 3, 1, 2)))
    if model in ("sdt", "qkformer"):  # SpikingJelly's own classes; they take [N, C, H, W] and repeat it T times
        from spikingjelly.activation_based.model.qkformer import QKFormer
        from spikingjelly.activation_based.model.spike_driven_transformer import SpikeDrivenTransformer

        net = (SpikeDrivenTransformer if model == "sdt" else QKFormer)(**arch)
        return net, lambda x: torch.from_numpy(np.ascontiguousarray(x[0].transpose(0, 3, 1, 2)))
    (hidden,) = arch["hidden"]
    net = torch.nn.Sequential(layer.Linear(arch["in_features"], hidden),
                              neuron.LIFNode(tau=2.0, detach_reset=True, surrogate_function=surrogate.Sigmoid()),
                              layer.Linear(hidden, arch["num_classes"]))
    functional.set_step_mode(net, "m")
    return net, lambda x: torch.from_numpy(x)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=workload.MODELS)
    p.add_argument("--T", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--width-div", type=int, default=1)
    p.add_argument("--image-size", type=int)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--backend", default="torch", choices=["torch", "triton", "cuda", "auto"],
                   help="the neurons' CUDA implementation (torch on a CPU)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before the ready line")
    args = p.parse_args(argv)

    if args.device == "cuda":
        for name in NEURON_IMPLEMENTATIONS:
            os.environ[f"SJ_{name}_CUDA_IMPLEMENTATION"] = args.backend
    elif args.backend != "torch":
        p.error(f"--backend {args.backend} needs --device cuda: on a CPU SpikingJelly runs its torch reference")
    import torch
    from spikingjelly.activation_based import functional

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    arch = workload.architecture(args.model, args.T, args.width_div, args.image_size)
    net, convert = build(args.model, arch)
    net.to(dev).train()
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x_np, y_np = workload.make_batch(args.model, args.batch_size, args.T, image_size=args.image_size)
    x, y = convert(x_np).to(dev), torch.from_numpy(y_np).long().to(dev)

    def step() -> float:
        functional.reset_net(net)
        with autocast:
            logits = net(x)  # [T, N, classes]; SpikingJelly's transformers return their time mean [N, classes]
            loss = torch.nn.functional.cross_entropy(logits.mean(0) if logits.ndim == 3 else logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        return loss.detach()

    first_loss = float(step())
    for _ in range(max(args.warmup - 1, 0)):
        step()
    ready = {"model": args.model, "architecture": {k: list(v) if isinstance(v, tuple) else v
                                                    for k, v in arch.items()},
             "batch_size": args.batch_size, "T": args.T, "loss": first_loss,
             "num_params": sum(q.numel() for q in net.parameters()), "device": args.device,
             "device_name": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
             "backend": args.backend, "dtype": args.dtype, "optimizer": "adam", "torch_version": torch.__version__,
             "spikingjelly_version": importlib.metadata.version("spikingjelly"),
             "torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads()}
    peer.serve({"time": lambda _: {"ms": peer.timed_ms(step)}}, ready)


if __name__ == "__main__":
    main()
