"""Spikformer-Ti (256 dims, depth 4, 8 heads) on CIFAR-10 from a tensorflow-datasets ``data_dir``."""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("spikformer", embed_dims=256, num_heads=8, depths=4, mlp_ratio=4.0)
    c.data.name = "cifar10"
    c.data.data_dir = "~/tensorflow_datasets"
    c.data.time_steps = 4
    c.data.encoder = "direct"
    c.global_batch_size = 64
    c.num_epochs = 300
    c.optimizer = "adamw"
    c.learning_rate = 5e-4
    c.weight_decay = 6e-2
    c.schedule = "warmup_cosine"
    c.warmup_steps = 2000
    c.log_every_steps = 50
    c.checkpoint_every_steps = 1000
    return c
