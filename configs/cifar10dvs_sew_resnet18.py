"""SEW-ResNet-18 (cnf ADD, PLIF neurons) on CIFAR10-DVS, T=16 frames downsampled to 64x64; batch 16,
Adam 1e-3 with cosine decay, cross-entropy of the time-mean logits."""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("sew_resnet18", cnf="ADD", spiking_neuron="PLIF",
                           detach_reset=True, surrogate_function="atan")
    c.data.name = "cifar10dvs"
    c.data.data_dir = "data/cifar10dvs"  # <class name>/*.aedat; frames are cached beside them
    c.data.time_steps = 16
    c.data.options.size = 64
    c.global_batch_size = 16
    c.num_epochs = 200
    c.optimizer = "adam"
    c.learning_rate = 1e-3
    c.schedule = "cosine"
    c.log_every_steps = 20
    c.checkpoint_every_steps = 500
    return c
