"""A spiking MLP on SHD as the snnTorch / Norse / SpyTorch SHD tutorials build it: 700-256 CUBA-LIF (current decay
0.8, potential decay 0.9 per step, detached reset), a linear head into a leaky-integrator readout (tau 10 steps) whose
membrane potentials are the logits (loss ``ce``: cross-entropy of their time mean), on frames of 10 ms
[T=100, N, 700] (the first second of each sample)."""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("mlp", hidden=(256,), spiking_neuron="CUBALIFNode", c_decay=0.8, v_decay=0.9,
                           detach_reset=True, readout={"type": "NonSpikingLIFNode", "tau": 10.0})
    c.data.name = "shd"
    c.data.data_dir = "data/shd"  # shd_train.h5, shd_test.h5
    c.data.time_steps = 100
    c.data.options.split_by = "duration"
    c.data.options.duration = 10  # ms per frame
    c.global_batch_size = 64
    c.num_epochs = 50
    c.optimizer = "adam"
    c.learning_rate = 1e-3
    c.schedule = "cosine"
    c.log_every_steps = 20
    c.checkpoint_every_steps = 500
    return c
