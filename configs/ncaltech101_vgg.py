"""SpikingJelly's CIFAR10DVSVGG on N-Caltech101 frames (T=10, 180x240 area-resized to 48x48; 102 classes with
BACKGROUND_Google, as SpikingJelly; first 90% of each class's files for training)."""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("cifar10dvs_vgg")
    c.data.name = "ncaltech101"
    c.data.data_dir = "data/ncaltech101"  # Caltech101/<class>/*.bin; frames are cached beside them
    c.data.time_steps = 10
    c.data.options.size = 48
    c.data.options.flip = True
    c.data.options.translate = 4
    c.global_batch_size = 32
    c.num_epochs = 100
    c.optimizer = "sgd"
    c.learning_rate = 0.1
    c.momentum = 0.9
    c.schedule = "cosine"
    c.log_every_steps = 20
    c.checkpoint_every_steps = 500
    return c
