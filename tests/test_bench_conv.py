"""The convolution benchmark: the step's convolutions found by tracing, the record without oneDNN, and (where oneDNN
is installed) its FFI convolution against the library's."""
from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from snnjax.bench import conv as bench
from snnjax.layers import conv_cpu
from snnjax.neurons.kernels.native.build import NativeBuildError


def test_model_convs_lists_each_problem_once_with_its_calls():
    convs = bench.model_convs("cifar10dvs_vgg", 2, 2, image_size=16, widths=(4,) * 8)
    same = {"w": [3, 3, 4, 4], "strides": [1, 1], "padding": [[1, 1], [1, 1]]}
    assert convs == [  # the batch is N * T; pooling before blocks 3, 5 and 7 halves the side
        {"x": [4, 16, 16, 2], "w": [3, 3, 2, 4], "strides": [1, 1], "padding": [[1, 1], [1, 1]], "calls": 1},
        {"x": [4, 16, 16, 4], **same, "calls": 1}, {"x": [4, 8, 8, 4], **same, "calls": 2},
        {"x": [4, 4, 4, 4], **same, "calls": 2}, {"x": [4, 2, 2, 4], **same, "calls": 2}]


def test_without_onednn_the_record_says_why_and_times_xla(monkeypatch, tmp_path):
    with pytest.raises(NativeBuildError, match="pip install onednn-cpu-gomp onednn-devel-cpu-gomp"):
        bench.onednn_dirs(str(tmp_path))
    find, convs = bench.onednn_dirs, bench.model_convs
    monkeypatch.setattr(bench, "onednn_dirs", lambda prefix=None: find(str(tmp_path)))  # an empty prefix
    monkeypatch.setattr(bench, "model_convs", functools.partial(convs, widths=(8,) * 8))
    bench.load_onednn.cache_clear()
    out = tmp_path / "conv.jsonl"
    try:
        bench.main(["--image-size", "16", "--batch-size", "1", "--T", "1", "--reps", "1", "--warmup", "0",
                    "--impls", "xla", "sparse", "onednn", "--density", "0.2", "--out", str(out)])
    finally:
        bench.load_onednn.cache_clear()
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert "onednn-cpu-gomp" in rec["onednn_error"] and "onednn_total_ms" not in rec
    assert rec["model"] == "cifar10dvs_vgg" and rec["xla_total_cpu_ms"] > 0 and rec["xla_threads"] >= 1
    assert len(rec["convs"]) == 5 and all(set(c["xla"]) == set(bench.PARTS) for c in rec["convs"])
    assert sum(c["calls"] for c in rec["convs"]) == 8
    assert rec["density"] == 0.2 and rec["sparse_total_cpu_ms"] > 0  # the sparse kernels against xla's, on spikes
    assert all(c["max_rel_err"]["sparse"] < 1e-5 for c in rec["convs"])


def _onednn_or_skip():
    try:
        bench.load_onednn()
    except NativeBuildError as e:
        pytest.skip(f"oneDNN not installed here: {e}")


# (x shape, kernel side, strides, padding): the zoo's forms (3 x 3 same, stride 2 onto an odd side, the 7 x 7 stem,
# the 1 x 1 stride-2 shortcut) and an uneven padding; a batch of 3 cuts unevenly into slices.
CASES = [((3, 9, 9, 3), 3, (1, 1), ((1, 1), (1, 1))), ((3, 9, 9, 3), 3, (2, 2), ((1, 1), (1, 1))),
         ((3, 12, 12, 2), 7, (2, 2), ((3, 3), (3, 3))), ((3, 8, 8, 4), 1, (2, 2), ((0, 0), (0, 0))),
         ((3, 7, 6, 2), 3, (2, 1), ((0, 1), (2, 0)))]


@pytest.fixture(scope="module")
def references():
    """Per case: the operands and the library's forward and gradients (one compile per case)."""
    _onednn_or_skip()
    rng = np.random.default_rng(0)
    out = []
    for x_shape, k, strides, pads in CASES:
        x = jnp.asarray(rng.standard_normal(x_shape, np.float32))
        w = jnp.asarray(rng.standard_normal((k, k, x_shape[3], 5), np.float32))
        y_shape = jax.eval_shape(lambda x, w, s=strides, p=pads: conv_cpu.conv2d_nhwc(x, w, s, p), x, w).shape
        g = jnp.asarray(rng.standard_normal(y_shape, np.float32))

        @jax.jit
        def forward_and_grads(x, w, g, s=strides, p=pads):
            y, vjp = jax.vjp(lambda x, w: conv_cpu.conv2d_nhwc(x, w, s, p), x, w)
            return (y, *vjp(g))

        out.append((strides, pads, x, w, g, *forward_and_grads(x, w, g)))
    return out


def test_onednn_conv_matches_the_library_conv(references):
    for parts in (2, 0):  # XLA's pool (a batch of 3: slices of 2 and 1), OpenMP's threads
        for strides, pads, x, w, g, y, dx, dw in references:
            common = dict(strides=strides, padding=pads, parts=parts)
            for ours, ref in ((bench.onednn_conv("forward", x, w, y.shape, **common), y),
                              (bench.onednn_conv("input_grad", g, w, x.shape, **common), dx),
                              (bench.onednn_conv("kernel_grad", x, g, w.shape, **common), dw)):
                np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(ref))))
