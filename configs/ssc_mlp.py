"""A spiking MLP (700-256-256-35, LIF, BatchNorm) on SSC frames [T=20, N, 700] (equal spike counts per frame)."""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("mlp", hidden=(256, 256), batch_norm=True)  # LIF tau 2
    c.data.name = "ssc"
    c.data.data_dir = "data/ssc"  # ssc_train.h5, ssc_valid.h5, ssc_test.h5 (train and test are used)
    c.data.time_steps = 20
    c.global_batch_size = 64
    c.num_epochs = 100
    c.optimizer = "adam"
    c.learning_rate = 1e-3
    c.schedule = "cosine"
    c.log_every_steps = 20
    c.checkpoint_every_steps = 500
    return c
