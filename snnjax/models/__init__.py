"""Spiking models: input ``[T, N, ...]`` (channels-last), logits ``[T, N, classes]``."""
from snnjax.models.mlp import SpikingMLP
from snnjax.models.qkformer import QKFormer, qkformer_10_384
from snnjax.models.registry import MODELS, create_model
from snnjax.models.sdt import SpikeDrivenTransformer, sdt_8_384
from snnjax.models.spikformer import Spikformer, spikformer_s, spikformer_ti
from snnjax.models.vgg import CIFAR10DVSVGG

__all__ = ["CIFAR10DVSVGG", "MODELS", "QKFormer", "SpikeDrivenTransformer", "Spikformer", "SpikingMLP", "create_model",
           "qkformer_10_384", "sdt_8_384", "spikformer_s", "spikformer_ti"]
