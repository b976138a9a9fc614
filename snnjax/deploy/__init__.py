"""After training: prediction, export (writer and reader), streaming, NIR, operation counts and energy.

- ``run``: a trained run restored for inference (``load_run``).
- ``prediction``: predictions of a run on a data split (``python -m snnjax.predict``).
- ``export``: a file that runs without the model's code (``python -m snnjax.export``); ``exported``: its reader,
  which imports only jax and numpy.
- ``streaming``: one time step at a time with carried neuron state (``Streamer``).
- ``nir``: NIR graphs to and from models (needs ``pip install snnjax[nir]``; imported as ``snnjax.deploy.nir``).
- ``opcount`` / ``energy``: synaptic operations per layer and their energy (``python -m snnjax.energy``).
- ``calls``: the layer calls of a model's own forward, recorded in order (the chain NIR and op counts read).
"""
from snnjax.deploy.calls import UnsupportedModelError
from snnjax.deploy.energy import energy_report
from snnjax.deploy.export import export_model, export_run
from snnjax.deploy.exported import ExportedFileError, ExportedModel, load_exported
from snnjax.deploy.opcount import OpReport, count_ops
from snnjax.deploy.prediction import Predictions, predict, predict_run
from snnjax.deploy.run import RestoredRun, load_run
from snnjax.deploy.streaming import Streamer

__all__ = ["ExportedFileError", "ExportedModel", "OpReport", "Predictions", "RestoredRun", "Streamer", "count_ops",
           "energy_report", "UnsupportedModelError", "export_model", "export_run", "load_exported", "load_run",
           "predict", "predict_run"]
