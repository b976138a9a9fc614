"""Spiking MLP on MNIST from a tensorflow-datasets ``data_dir`` (array_record), Poisson rate coding."""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("mlp", hidden=(800,))  # LIF tau 2, detach_reset
    c.data.name = "mnist"
    c.data.data_dir = "~/tensorflow_datasets"
    c.data.time_steps = 8
    c.data.encoder = "poisson"
    c.global_batch_size = 128
    c.num_epochs = 10
    c.learning_rate = 1e-3
    c.log_every_steps = 50
    c.checkpoint_every_steps = 1000
    return c
