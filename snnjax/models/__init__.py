"""The model zoo: SpikingJelly's constructors with SpikingJelly's keywords, channels-last and time-major.

Every zoo model takes input ``[T, N, ...]`` (channels-last images ``[T, N, H, W, C]``; the transformers and
MS-ResNet also a static image ``[N, H, W, C]`` repeated ``T`` times) and returns per-step outputs
``[T, N, classes]``. SpikingJelly's SDT, QKFormer and MS-ResNet return their time mean (``out.mean(0)``)
instead; the trainer's losses average over ``T`` for every model alike.

Constructors (SpikingJelly's names and keywords): ``spiking_resnet18/34/50``, ``sew_resnet18/34/50``
(``cnf=``), ``ms_resnet18/34``, ``max_resnet18``, ``MSResNet``, ``MaxResNet``, ``DVSGestureNet``,
``CIFAR10DVSNet``, ``NMNISTNet``, ``SpikeDrivenTransformer``, ``sdt_8_384``, ``QKFormer``, ``qkformer_10_384``,
``Spikformer``, ``spikformer_ti``, ``spikformer_s``, ``CIFAR10DVSVGG``, ``SpikingVGG``,
``spiking_vgg11/13/16/19`` and ``_bn``, ``OTTTSpikingVGG``, ``ottt_spiking_vggws``, ``ottt_spiking_vgg11/13/16/19``
and ``_ws``; snnjax's ``SpikingMLP`` and
``Sequential``. Each takes ``spiking_neuron`` (a ``snnjax.neurons`` class, or as a config convenience its name
``"IF"`` / ``"LIF"`` / ``"PLIF"``) and the neuron keywords as ``**kwargs``, built as SpikingJelly builds them
(``snnjax.models.neuron_options``), and ``rngs`` (default ``nnx.Rngs(0)``), ``dtype``, ``param_dtype``.

    model = snnjax.models.sew_resnet34(cnf="IAND", num_classes=10, spiking_neuron=snnjax.neurons.ParametricLIFNode,
                                       init_tau=2.5, detach_reset=True, surrogate_function=snnjax.neurons.Sigmoid())

``create_model(name, options)`` builds a registered model from config values (``snnjax.models.registry``).
"""
from snnjax.models.mlp import SpikingMLP
from snnjax.models.ms_resnet import MaxResNet, MSResNet, max_resnet18, ms_resnet18, ms_resnet34
from snnjax.models.ottt_vgg import (
    OTTTSpikingVGG,
    ottt_spiking_vgg11,
    ottt_spiking_vgg11_ws,
    ottt_spiking_vgg13,
    ottt_spiking_vgg13_ws,
    ottt_spiking_vgg16,
    ottt_spiking_vgg16_ws,
    ottt_spiking_vgg19,
    ottt_spiking_vgg19_ws,
    ottt_spiking_vggws,
)
from snnjax.models.plif_net import CIFAR10DVSNet, DVSGestureNet, NMNISTNet, ParametricLIFNet
from snnjax.models.qkformer import QKFormer, qkformer_10_384
from snnjax.models.registry import REGISTRY, create_model
from snnjax.models.resnet import (
    ResNet,
    sew_resnet18,
    sew_resnet34,
    sew_resnet50,
    spiking_resnet18,
    spiking_resnet34,
    spiking_resnet50,
)
from snnjax.models.sdt import SpikeDrivenTransformer, sdt_8_384
from snnjax.models.sequential import Sequential
from snnjax.models.spikformer import Spikformer, spikformer_s, spikformer_ti
from snnjax.models.spiking_vgg import (
    SpikingVGG,
    spiking_vgg11,
    spiking_vgg11_bn,
    spiking_vgg13,
    spiking_vgg13_bn,
    spiking_vgg16,
    spiking_vgg16_bn,
    spiking_vgg19,
    spiking_vgg19_bn,
)
from snnjax.models.vgg import CIFAR10DVSVGG

__all__ = [
    "CIFAR10DVSNet", "CIFAR10DVSVGG", "DVSGestureNet", "MSResNet", "MaxResNet", "NMNISTNet", "OTTTSpikingVGG",
    "ParametricLIFNet", "QKFormer", "REGISTRY", "ResNet", "Sequential", "SpikeDrivenTransformer", "Spikformer",
    "SpikingMLP", "SpikingVGG", "create_model", "max_resnet18", "ms_resnet18", "ms_resnet34",
    "ottt_spiking_vgg11", "ottt_spiking_vgg11_ws", "ottt_spiking_vgg13", "ottt_spiking_vgg13_ws",
    "ottt_spiking_vgg16", "ottt_spiking_vgg16_ws", "ottt_spiking_vgg19", "ottt_spiking_vgg19_ws",
    "ottt_spiking_vggws", "qkformer_10_384", "sdt_8_384", "sew_resnet18", "sew_resnet34", "sew_resnet50",
    "spikformer_s", "spikformer_ti", "spiking_resnet18", "spiking_resnet34", "spiking_resnet50", "spiking_vgg11",
    "spiking_vgg11_bn", "spiking_vgg13", "spiking_vgg13_bn", "spiking_vgg16", "spiking_vgg16_bn", "spiking_vgg19",
    "spiking_vgg19_bn"
]
