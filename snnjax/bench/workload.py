"""The benchmarks' workloads: model architectures and synthetic inputs, shared by both sides of a comparison.

NumPy only (no JAX, no torch): SpikingJelly's side runs this file from its own interpreter (as a script's
sibling module), so both frameworks build the same architecture and see bit-identical inputs.
"""
from __future__ import annotations

import numpy as np

MODELS = ("cifar10dvs_vgg", "spikformer_ti", "mlp", "sdt", "qkformer", "sew_resnet18", "spiking_resnet18",
          "dvsgesture_plif", "ms_resnet18")
# a static 32 x 32 x 3 image repeated T times
_ZOO_NEURON = {"detach_reset": True, "surrogate_function": "atan"}  # the three CNN zoo models' neuron keywords
STATIC_IMAGES = ("spikformer_ti", "sdt", "qkformer", "spiking_resnet18", "ms_resnet18")
EVENT_MODELS = ("cifar10dvs_vgg", "sew_resnet18", "dvsgesture_plif")  # inputs are event counts
VGG_WIDTHS = (64, 128, 256, 256, 512, 512, 512, 512)  # SpikingJelly's CIFAR10DVSVGG
VGG_POOLS = (False, False, True, False, True, False, True, False)  # an AvgPool2d(2) before these blocks


def input_shape(model: str, image_size: int | None = None) -> tuple[int, ...]:
    """Per-example, per-time-step input shape (channels-last); ``image_size`` replaces the frames' side."""
    shape = {"cifar10dvs_vgg": (48, 48, 2), "mlp": (64,), "sew_resnet18": (64, 64, 2),
             "dvsgesture_plif": (128, 128, 2)}.get(model, (32, 32, 3))
    return shape if image_size is None or model == "mlp" else (image_size, image_size, shape[-1])


def architecture(model: str, t: int, width_div: int = 1, image_size: int | None = None) -> dict:
    """The model's constructor arguments (snnjax's names) with every hidden width divided by ``width_div``.

    ``width_div`` 1 is the full model: SpikingJelly's CIFAR10DVSVGG; Spikformer-Ti (256 dims, depth 4,
    8 heads, MLP ratio 4) on 32 x 32 x 3 images; the spiking MLP 64 -> 256 -> 10; SpikingJelly's
    ``sdt_8_384`` and ``qkformer_10_384`` on 32 x 32 x 3 images; SEW-ResNet-18 (cnf ADD,
    PLIF neurons) on 64 x 64 CIFAR10-DVS-like event frames; Spiking ResNet-18 (IF neurons) on 32 x 32 x 3
    images; DVSGestureNet (128 channels, PLIF neurons, 11 classes) on 128 x 128 event frames. The
    neurons of these three CNN zoo models use the ATan surrogate and ``detach_reset``. SpikingJelly's
    ``ms_resnet18`` (its own neurons: LIF, Rect surrogate) on 32 x 32 x 3 images, ``base_channels`` divided.
    """
    if width_div < 1:
        raise ValueError(f"width_div must be at least 1, got {width_div}")
    if model == "cifar10dvs_vgg":
        widths = tuple(max(w // width_div, 1) for w in VGG_WIDTHS)
        return {"widths": widths, "pools": VGG_POOLS, "in_channels": 2, "image_size": image_size or 48,
                "num_classes": 10}
    if model == "spikformer_ti":
        dims = 256 // width_div
        if dims < 8 or dims % 8:
            raise ValueError(f"width_div={width_div} leaves spikformer_ti {dims} dims; it needs a multiple of 8")
        return {"embed_dims": dims, "num_heads": 8, "depths": 4, "mlp_ratio": 4.0, "img_size_h": image_size or 32,
                "img_size_w": image_size or 32,
                "in_channels": 3, "num_classes": 10, "T": t}
    if model == "mlp":
        return {"in_features": 64, "hidden": (max(256 // width_div, 1),), "num_classes": 10}
    if model in ("sdt", "qkformer"):  # SpikingJelly's sdt_8_384 / qkformer_10_384, 10 classes
        dims = 384 // width_div
        if dims < 24 or dims % 24:
            raise ValueError(f"width_div={width_div} leaves {model} {dims} dims; it needs a multiple of 24")
        if model == "sdt":
            return {"embed_dims": dims, "num_heads": 8, "depths": 8, "mlp_ratio": 4.0, "pooling_stat": "1111",
                    "in_channels": 3, "num_classes": 10, "T": t}
        return {"embed_dims": dims, "num_heads": (6, 6, 6), "depths": (1, 2, 7), "mlp_ratio": 4.0,
                "qka_type": "token", "in_channels": 3, "num_classes": 10, "T": t}
    if model in ("sew_resnet18", "spiking_resnet18"):
        sew = model == "sew_resnet18"
        return {"depth": 18, "cnf": "ADD" if sew else None, "widths": tuple(max(w // width_div, 1) for w in
                                                                          (64, 128, 256, 512)),
                "in_channels": 2 if sew else 3, "num_classes": 10, "spiking_neuron": "PLIF" if sew else "IF",
                **_ZOO_NEURON}
    if model == "ms_resnet18":
        return {"T": t, "base_channels": max(64 // width_div, 1), "in_channels": 3, "num_classes": 10}
    if model == "dvsgesture_plif":
        return {"stages": 5, "channels": max(128 // width_div, 1), "hidden_features": max(512 // width_div, 1),
                "in_channels": 2, "image_size": image_size or 128, "num_classes": 11, "spiking_neuron": "PLIF",
                **_ZOO_NEURON}
    raise ValueError(f"unknown model {model!r}; choose from {', '.join(MODELS)}")


def make_batch(model: str, batch: int, t: int, seed: int = 0,
               image_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs [T, N, ...] float32, labels [N] int32)``: event counts for the event models, a static N(0, 1)
    image repeated over T for the image models, uniform [0, 2) for the MLP."""
    rng = np.random.default_rng(seed)
    shape = (t, batch, *input_shape(model, image_size))
    if model in EVENT_MODELS:
        x = (rng.random(shape) < 0.3) * rng.integers(1, 4, shape)
    elif model in STATIC_IMAGES:
        x = np.broadcast_to(rng.standard_normal((1, *shape[1:])), shape)
    else:
        x = rng.random(shape) * 2.0
    return np.ascontiguousarray(x, np.float32), rng.integers(0, 10, batch).astype(np.int32)


# The recurrent catalogue neurons the neuron benchmark times (``--neuron NAME``; snnjax.neurons.catalogue, and
# SpikingJelly's classes of the same names), built with their defaults plus these keywords (``act`` by name: jax.nn's
# and torch's; GatedLIFNode's ``T`` is the run's).
CATALOGUE_NEURONS = ("CUBALIFNode", "ComplementaryLIFNode", "EIFNode", "GatedLIFNode", "HalfThresholdIFNode",
                     "ILIFNode", "IzhikevichNode", "KLIFNode", "LIAFNode", "NonSpikingIFNode", "NonSpikingLIFNode",
                     "QIFNode", "RAFNode", "TernaryIFNode", "TernaryLIFNode")
CATALOGUE_KEYWORDS = {"LIAFNode": {"act": "relu", "threshold_related": True}}


def lif_inputs(t: int, batch: int, features: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, ds)`` float32 ``[t, batch, features]`` of the neuron benchmark: x = 0.5 + N(0,1), ds = N(0,1), seeded
    by t."""
    rng = np.random.default_rng(1000 + t)
    shape = (t, batch, features)
    x = rng.standard_normal(shape, dtype=np.float32)
    x += 0.5
    return x, rng.standard_normal(shape, dtype=np.float32)


# The peers' benchmark (``snnjax.bench.peers``): a layer (``Linear(N, N)`` or a 3x3 ``Conv2d(N, N)``, padding 1)
# followed by LIF, loss = the spike sum, its gradient with respect to the weight and the input.
PEER_WORKLOADS = ("linear", "conv")
# The LIF neuron of the comparison in SpikingJelly's terms (its ``LIFNode`` defaults, surrogate Sigmoid(alpha)).
PEER_LIF = {"tau": 2.0, "decay_input": True, "v_threshold": 1.0, "v_reset": 0.0, "detach_reset": False,
            "sigmoid_alpha": 4.0}


def peer_problem(workload: str, t: int, batch: int, n: int, image_size: int = 16) -> dict[str, np.ndarray]:
    """Float32 arrays in snnjax's layouts: ``x`` ``[T, B, N]`` (linear) or ``[T, B, H, W, N]`` (conv, H = W =
    ``image_size``), ``kernel`` ``[N, N]`` (in, out) or ``[3, 3, N, N]`` (HWIO), ``bias`` ``[N]``.

    x is N(0, 1); the kernel N(0, 1.5^2 / fan_in), so the pre-activations have a standard deviation near 1.5 and
    about a fifth of the neuron-steps fire; the bias N(0, 0.1^2). Seeded by the sizes."""
    if workload not in PEER_WORKLOADS:
        raise ValueError(f"workload must be one of {PEER_WORKLOADS}, got {workload!r}")
    rng = np.random.default_rng([t, batch, n, image_size, PEER_WORKLOADS.index(workload)])
    conv = workload == "conv"
    x_shape = (t, batch, image_size, image_size, n) if conv else (t, batch, n)
    k_shape = (3, 3, n, n) if conv else (n, n)
    fan_in = 9 * n if conv else n
    return {"x": rng.standard_normal(x_shape, dtype=np.float32),
            "kernel": (rng.standard_normal(k_shape, dtype=np.float32) * np.float32(1.5 / np.sqrt(fan_in))),
            "bias": rng.standard_normal(n, dtype=np.float32) * np.float32(0.1)}
