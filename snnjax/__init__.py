"""snnjax: spiking neural networks in JAX.

What a notebook needs, importable from here:

    import snnjax
    net = snnjax.Sequential(...)                                   # or any nnx.Module, snnjax.models.*
    trainer = snnjax.trainer(net, "fsdp=4,tensor=2", optax.adam(1e-3))
    trainer.step(batch); trainer.evaluate(batches); trainer.save(dir); trainer.model()
    net = snnjax.load_model(net, dir)

Subpackages: ``neurons``, ``layers``, ``models``, ``parallel``, ``train``, ``data``, ``interop``,
``monitor`` (firing rates), ``viz`` (plots; needs matplotlib: ``pip install snnjax[viz]``).

``snnjax.neurons`` is imported first: the kernel packages (``snnjax.pallas``, ``snnjax.native``)
import ``snnjax.neurons.base``, and ``snnjax.neurons.dispatch`` imports them, so the neurons
package must be initialised before either kernel package, whichever a program imports first.
"""
from snnjax import neurons  # noqa: F401, I001  (the first package: see above)
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from snnjax import layers, models, parallel  # noqa: F401
from snnjax.models.sequential import Sequential
from snnjax.parallel.pipeline_plan import PipelineOptions
from snnjax.train.model_trainer import ModelTrainer, load_model, trainer

try:
    __version__ = _version("snnjax")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["ModelTrainer", "PipelineOptions", "Sequential", "__version__", "layers", "load_model", "models", "neurons",
           "parallel", "trainer"]
