"""Spiking models: input ``[T, N, ...]`` (channels-last), logits ``[T, N, classes]``."""
from snnjax.models.mlp import SpikingMLP
from snnjax.models.registry import MODELS, create_model
from snnjax.models.sequential import Sequential
from snnjax.models.spikformer import Spikformer, spikformer_s, spikformer_ti
from snnjax.models.vgg import CIFAR10DVSVGG

__all__ = ["CIFAR10DVSVGG", "MODELS", "Sequential", "Spikformer", "SpikingMLP", "create_model", "spikformer_s",
           "spikformer_ti"]
