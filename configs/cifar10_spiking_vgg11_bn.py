"""SpikingJelly's spiking VGG-11 with BatchNorm (LIF neurons, ATan surrogate, detach_reset) on CIFAR-10 at T=4 (each
image repeated over T), batch 64; Adam 1e-3 with cosine decay: a starting point, not a tuned recipe."""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("spiking_vgg11_bn", spiking_neuron="LIF", detach_reset=True, surrogate_function="atan")
    c.data.name = "cifar10"
    c.data.data_dir = "~/tensorflow_datasets"
    c.data.time_steps = 4
    c.data.encoder = "direct"
    c.global_batch_size = 64
    c.num_epochs = 200
    c.optimizer = "adam"
    c.learning_rate = 1e-3
    c.schedule = "cosine"
    c.log_every_steps = 50
    c.checkpoint_every_steps = 1000
    return c
