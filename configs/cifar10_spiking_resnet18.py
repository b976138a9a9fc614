"""Spiking ResNet-18 (IF neurons, ATan surrogate, detach_reset) on CIFAR-10 at T=32 (each image repeated over
T), batch 100: the setting of SpikingJelly's multi-step benchmarks; Adam 1e-3 with cosine decay."""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("spiking_resnet18", spiking_neuron="IF",
                           detach_reset=True, surrogate_function="atan")
    c.data.name = "cifar10"
    c.data.data_dir = "~/tensorflow_datasets"
    c.data.time_steps = 32
    c.data.encoder = "direct"
    c.global_batch_size = 100
    c.num_epochs = 200
    c.optimizer = "adam"
    c.learning_rate = 1e-3
    c.schedule = "cosine"
    c.log_every_steps = 50
    c.checkpoint_every_steps = 1000
    return c
