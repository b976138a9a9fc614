"""The README's Python quickstart (less the noqa comments): a 3-layer spiking conv net of your own under
fsdp=4,tensor=2, then, from those weights, under a pipeline."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # before JAX starts

import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

import snnjax  # noqa: E402
from snnjax import layers  # noqa: E402
from snnjax.neurons import LIFNode  # noqa: E402

rngs = nnx.Rngs(0)
net = snnjax.Sequential(  # any nnx.Module mapping [T, N, H, W, C] to logits [T, N, classes] will do
    layers.conv2d(2, 16, 3, padding=1, rngs=rngs, axes=("embed", "mlp")), layers.BatchNorm(16, axes=("mlp",)),
    LIFNode(tau=2.0, step_mode="m"), layers.MaxPool2d(2),
    layers.conv2d(16, 32, 3, padding=1, rngs=rngs, axes=("mlp", "embed")), layers.BatchNorm(32, axes=("embed",)),
    LIFNode(tau=2.0, step_mode="m"),
    layers.Flatten(), layers.linear(32 * 8 * 8, 10, rngs=rngs, axes=("embed", "classes")),
)
rng = np.random.default_rng(0)
batches = [{"inputs": (rng.random((4, 16, 16, 16, 2)) < 0.3).astype(np.float32),  # [T, N, H, W, C]
            "labels": rng.integers(0, 10, 16)} for _ in range(4)]

trainer = snnjax.trainer(net, "fsdp=4,tensor=2", optax.adam(1e-3))
trainer.fit(batches)                        # or trainer.step(batch) -> {"loss", "accuracy", "grad_norm"}
print(trainer.evaluate(batches))            # {"loss", "accuracy"}, eval mode
trainer.save("quickstart_ckpt", overwrite=True)  # without overwrite, a folder with checkpoints is refused

pipe = snnjax.trainer(trainer.model(), "stage=2,data=4", optax.adam(1e-3), example=batches[0])
pipe.fit(batches)
print(pipe.evaluate(batches))
model = pipe.model()                                       # an nnx.Module again
model = snnjax.load_model(model, "quickstart_ckpt")        # a checkpoint (any layout's, or train.py's) into a model
