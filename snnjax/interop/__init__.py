"""Interoperability with SpikingJelly.

- ``spikingjelly``: ``import_state_dict``, the one importer of a SpikingJelly (PyTorch) ``state_dict``, into a
  zoo model or any model built from snnjax's layers and neurons (``snnjax.Sequential`` or your own), with a report.
- ``layers``: the converters and per-layer rules (``layer_locator``: keys located layer by layer); ``rules``: a
  zoo family's rule table applied (each family declares its table in its model file,
  ``snnjax.models.registry.register_rules``).
- ``check``: recompute a SpikingJelly reference file (golden outputs and gradients) and
  report how far snnjax is from it; ``python -m snnjax.interop check FILE.npz`` (``__main__``).
"""
from snnjax.interop.layers import ImportReport, LayerRule, spikingjelly_inputs
from snnjax.interop.spikingjelly import convert_state_dict, import_state_dict

__all__ = ["ImportReport", "LayerRule", "convert_state_dict", "import_state_dict", "spikingjelly_inputs"]
