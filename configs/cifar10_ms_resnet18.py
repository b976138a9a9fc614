"""MS-ResNet-18 (SpikingJelly's ``ms_resnet18`` defaults: LIF tau 4/3, threshold 0.5, detach_reset, Rect surrogate)
on CIFAR-10 at T=6 (SpikingJelly's default; each image repeated over T), batch 100; Adam 1e-3 with cosine decay.

SpikingJelly's defaults keep the ImageNet stem (7x7 conv, stride 2; the first stage strides too):
``--config.model.stem_kernel_size=3 --config.model.stem_stride=1`` keeps more of a 32x32 image."""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("ms_resnet18")
    c.data.name = "cifar10"
    c.data.data_dir = "~/tensorflow_datasets"
    c.data.time_steps = 6
    c.data.encoder = "direct"
    c.global_batch_size = 100
    c.num_epochs = 200
    c.optimizer = "adam"
    c.learning_rate = 1e-3
    c.schedule = "cosine"
    c.log_every_steps = 50
    c.checkpoint_every_steps = 1000
    return c
