"""SpikingJelly's DVSGestureNet on DVS128 Gesture (its classify_dvsg recipe): T=16 frames of 128x128, PLIF
neurons (ATan surrogate, detach_reset), batch 16, Adam 1e-3 with cosine decay, MSE of the voting layer's
firing rates against one-hot labels."""
from snnjax.models.registry import model_config
from snnjax.train.config import base_config


def get_config():
    c = base_config()
    c.model = model_config("dvsgesture_net", spiking_neuron="PLIF",
                           detach_reset=True, surrogate_function="atan")  # 5 x Conv-BN-PLIF-MaxPool, 128 channels
    c.data.name = "dvs128_gesture"
    c.data.data_dir = "data/dvs128_gesture"
    c.data.time_steps = 16
    c.global_batch_size = 16
    c.num_epochs = 64
    c.optimizer = "adam"
    c.learning_rate = 1e-3
    c.schedule = "cosine"
    c.loss = "mse"
    c.log_every_steps = 20
    c.checkpoint_every_steps = 500
    return c
