"""QKFormer-10-384 (SpikingJelly's ``qkformer_10_384``) on ImageNet-1k from an image folder: T=4, 224x224.

``data.name = "image_folder"`` reads ``data_dir/<split>/<class>/*.JPEG``. Without the data:
``--config.data.name=synthetic_dvs --config.data.options.size=32`` (event frames stand in for the
images; the model takes their 2 channels).
"""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("qkformer", embed_dims=384, num_heads=(6, 6, 6), depths=(1, 2, 7), mlp_ratio=4.0,
                           qka_type="token")
    c.data.name = "image_folder"
    c.data.data_dir = "data/imagenet"
    c.data.time_steps = 4
    c.data.encoder = "direct"
    c.data.options.size = 224
    c.global_batch_size = 256
    c.num_epochs = 200
    c.optimizer = "adamw"
    c.learning_rate = 6e-4
    c.weight_decay = 5e-2
    c.schedule = "warmup_cosine"
    c.warmup_steps = 5000
    c.log_every_steps = 50
    c.checkpoint_every_steps = 2000
    return c
