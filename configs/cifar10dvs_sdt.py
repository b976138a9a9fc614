"""Spike-Driven Transformer (2 blocks, 256 dims, 16 heads, the paper's DVS size) on CIFAR10-DVS: T=10, TET loss.

Event frames ``[10, 128, 128, 2]``; the four-stage stem pools to an 8x8 token grid. Neurons are
SpikingJelly's defaults (LIF tau 2, Sigmoid surrogate). Without the data:
``--config.data.name=synthetic_dvs`` (add ``--config.data.options.size=32`` for a quick CPU run).
"""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("sdt", embed_dims=256, num_heads=16, depths=2, mlp_ratio=4.0, pooling_stat="1111")
    c.data.name = "cifar10dvs"
    c.data.data_dir = "data/cifar10dvs"  # <class name>/*.aedat; frames are cached beside them
    c.data.time_steps = 10
    c.data.options.size = 128
    c.loss = "tet"
    c.tet_lambda = 1e-3
    c.global_batch_size = 16
    c.num_epochs = 200
    c.optimizer = "adamw"
    c.learning_rate = 1e-3
    c.weight_decay = 1e-2
    c.schedule = "cosine"
    c.log_every_steps = 20
    c.checkpoint_every_steps = 500
    return c
