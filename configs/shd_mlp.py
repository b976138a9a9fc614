"""A spiking MLP (700-256-256-20, LIF, BatchNorm) on SHD frames [T=20, N, 700] (equal spike counts per frame)."""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("mlp", hidden=(256, 256), batch_norm=True)  # LIF tau 2
    c.data.name = "shd"
    c.data.data_dir = "data/shd"  # shd_train.h5, shd_test.h5
    c.data.time_steps = 20
    c.global_batch_size = 64
    c.num_epochs = 100
    c.optimizer = "adam"
    c.learning_rate = 1e-3
    c.schedule = "cosine"
    c.log_every_steps = 20
    c.checkpoint_every_steps = 500
    return c
