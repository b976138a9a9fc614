"""Stateless layers applied to time-major ``[T, N, ...]`` tensors as one merged batch."""
from snnjax.layers.activation import ReLU
from snnjax.layers.batchnorm import BatchNorm
from snnjax.layers.connect import CONNECTS, sew_connect
from snnjax.layers.conv import Flatten, Scale, WSConv2d, WSLinear, conv2d, flatten_features, linear, linear_general
from snnjax.layers.conv_cpu import compiler_options
from snnjax.layers.dropout import dropout
from snnjax.layers.pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d, adaptive_avg_pool2d, avg_pool2d, max_pool2d
from snnjax.layers.voting import vote

__all__ = [
    "CONNECTS", "AdaptiveAvgPool2d", "AvgPool2d", "BatchNorm", "Flatten", "MaxPool2d", "ReLU", "Scale", "WSConv2d",
    "WSLinear", "adaptive_avg_pool2d", "avg_pool2d", "compiler_options", "conv2d", "dropout", "flatten_features",
    "linear", "linear_general", "max_pool2d", "sew_connect", "vote"
]
