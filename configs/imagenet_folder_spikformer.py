"""Spikformer (384 dims, depth 8, 12 heads, as Spikformer-8-384) on an ImageNet-style folder at 224x224, T=4.

Train images: random-resized crop and flip; eval: resize 256 + centre crop 224 (snnjax/data/image_folder.py).
"""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("spikformer", embed_dims=384, num_heads=12, depths=8, mlp_ratio=4.0)
    c.data.name = "image_folder"
    c.data.data_dir = "data/imagenet"  # train/<class>/*.JPEG, val/<class>/*.JPEG
    c.data.time_steps = 4
    c.data.encoder = "direct"
    c.data.options.size = 224
    c.data.options.num_workers = 8
    c.data.prefetch = 4
    c.global_batch_size = 256
    c.num_epochs = 300
    c.optimizer = "adamw"
    c.learning_rate = 5e-4
    c.weight_decay = 6e-2
    c.schedule = "warmup_cosine"
    c.warmup_steps = 2000
    c.log_every_steps = 50
    c.checkpoint_every_steps = 1000
    return c
