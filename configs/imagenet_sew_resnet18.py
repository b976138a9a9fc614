"""SEW-ResNet-18 (cnf ADD, IF neurons, ATan surrogate, detach_reset: the SEW-ResNet paper's setting) on ImageNet
from an image folder, T=4 (each image repeated over T); SGD 0.1, momentum 0.9, cosine decay, batch 256."""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("sew_resnet18", cnf="ADD", spiking_neuron="IF",
                           detach_reset=True, surrogate_function="atan")
    c.data.name = "image_folder"
    c.data.data_dir = "data/imagenet"
    c.data.time_steps = 4
    c.data.encoder = "direct"
    c.global_batch_size = 256
    c.num_epochs = 320
    c.optimizer = "sgd"
    c.learning_rate = 0.1
    c.momentum = 0.9
    c.schedule = "cosine"
    c.log_every_steps = 50
    c.checkpoint_every_steps = 2000
    return c
