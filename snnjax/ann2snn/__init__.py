"""ANN-to-SNN conversion with SpikingJelly's rate-coding converter: a trained ReLU ``Sequential`` into an IF-neuron
``Sequential`` (``Converter``; its ``mode`` ``"max"``, ``"99.9%"`` or a fraction of the maximum). ``python -m
snnjax.ann2snn.digits`` trains a ReLU CNN on the embedded digits, converts it and prints accuracy against T."""
from snnjax.ann2snn.converter import Converter, VoltageScale, VoltageScaler, fold_batchnorm

__all__ = ["Converter", "VoltageScale", "VoltageScaler", "fold_batchnorm"]
