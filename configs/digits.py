"""Spiking MLP on scikit-learn's handwritten digits (8x8, no download): the embedded default."""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("mlp", hidden=(256,))  # LIF tau 2, detach_reset
    c.data.name = "digits"
    c.data.time_steps = 4
    c.global_batch_size = 64
    c.num_epochs = 30
    c.learning_rate = 3e-3
    c.schedule = "cosine"
    c.log_every_steps = 11
    c.checkpoint_every_steps = 200
    return c
