"""snnjax: spiking neural networks in JAX.

What a notebook needs, importable from here:

    import snnjax
    net = snnjax.Sequential(...)                                   # or any nnx.Module, snnjax.models.*
    trainer = snnjax.trainer(net, "fsdp=4,tensor=2", optax.adam(1e-3))
    trainer.step(batch); trainer.evaluate(batches); trainer.save(dir); trainer.model()
    net = snnjax.load_model(net, dir)

Subpackages: ``neurons``, ``layers``, ``models``, ``parallel``, ``train``, ``data``, ``interop``, ``deploy``,
``ann2snn``, ``runtime``; modules ``monitor`` (firing rates), ``learning`` (STDP) and ``viz`` (plots; needs
matplotlib: ``pip install snnjax[viz]``, so ``from snnjax import viz`` imports it). The names in each one's
``__all__`` are the public API; every module not listed there (``snnjax.train.step``, ``snnjax.neurons.kernels``,
...) is internal and may change.

Importing snnjax changes no process-wide setting (no ``XLA_FLAGS``, no ``jax.config``): the library's compiled
steps pass their XLA options per compile (``snnjax.layers.conv_cpu.compiler_options``).
"""
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from snnjax import ann2snn, data, deploy, interop, layers, learning, models, monitor, neurons, parallel, runtime, train  # noqa: F401
from snnjax.models.sequential import Sequential
from snnjax.parallel.pipeline_plan import PipelineOptions
from snnjax.train.model_trainer import ModelTrainer, load_model, trainer

try:
    __version__ = _version("snnjax")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["ModelTrainer", "PipelineOptions", "Sequential", "__version__", "ann2snn", "data", "deploy", "interop",
           "layers", "learning", "load_model", "models", "monitor", "neurons", "parallel", "runtime", "train",
           "trainer"]
