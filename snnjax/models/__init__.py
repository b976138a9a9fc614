"""Spiking models: input ``[T, N, ...]`` (channels-last), logits ``[T, N, classes]``."""
from snnjax.models.mlp import SpikingMLP
from snnjax.models.ms_resnet import MaxResNet, MSResNet, max_resnet18, ms_resnet18, ms_resnet34
from snnjax.models.plif_net import ParametricLIFNet, cifar10dvs_net, dvsgesture_net, nmnist_net
from snnjax.models.qkformer import QKFormer, qkformer_10_384
from snnjax.models.registry import MODELS, create_model
from snnjax.models.resnet import ResNet, sew_resnet, spiking_resnet
from snnjax.models.sdt import SpikeDrivenTransformer, sdt_8_384
from snnjax.models.sequential import Sequential
from snnjax.models.spikformer import Spikformer, spikformer_s, spikformer_ti
from snnjax.models.vgg import CIFAR10DVSVGG

__all__ = ["CIFAR10DVSVGG", "MODELS", "MSResNet", "MaxResNet", "ParametricLIFNet", "QKFormer", "ResNet", "Sequential",
           "SpikeDrivenTransformer", "Spikformer", "SpikingMLP", "cifar10dvs_net", "create_model", "dvsgesture_net",
           "max_resnet18", "ms_resnet18", "ms_resnet34", "nmnist_net", "qkformer_10_384", "sdt_8_384", "sew_resnet",
           "spikformer_s", "spikformer_ti", "spiking_resnet"]
