"""SpikingJelly's CIFAR10DVSVGG on CIFAR10-DVS event frames (T=10, 2x48x48), as in its memopt example."""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("cifar10dvs_vgg")  # SpikingJelly's defaults: LIF tau 1.333, ATan, dropout 0.25
    c.data.name = "cifar10dvs"
    c.data.data_dir = "data/cifar10dvs"  # <class name>/*.aedat; frames are cached beside them
    c.data.time_steps = 10
    c.data.options.size = 48
    c.global_batch_size = 32
    c.num_epochs = 100
    c.optimizer = "sgd"
    c.learning_rate = 0.1
    c.momentum = 0.9
    c.schedule = "cosine"
    c.log_every_steps = 20
    c.checkpoint_every_steps = 500
    return c
