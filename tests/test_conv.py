"""The CPU convolution (``snnjax.layers.conv_cpu``): forward and both gradients equal XLA's.

Compared with ``lax.conv_general_dilated`` and ``nnx.Conv`` in float64 (to rounding) for the
models' 3x3 / padding 1 / stride 1 and other kernel sizes, paddings and strides; under jit,
inside ``lax.scan``, in bfloat16 (looser), and with the batch split over 8 devices.
Small shapes only: speed is ``snnjax.bench.train_step``'s business.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from snnjax import layers, parallel
from snnjax.layers import conv_cpu, sparse_conv
from snnjax.models import CIFAR10DVSVGG
from snnjax.parallel.logical import activation_rules

DN = ("NHWC", "HWIO", "NHWC")
# (kernel, stride, padding): the models' case first, then other forms conv2d() accepts.
CASES = [(3, 1, ((1, 1), (1, 1))), (1, 1, ((0, 0), (0, 0))), (3, 1, ((0, 0), (0, 0))), (5, 1, ((2, 2), (2, 2))),
         (3, 2, ((1, 1), (1, 1))), (2, 2, ((0, 0), (0, 0))), (3, 2, ((0, 1), (2, 0))), (4, 3, ((1, 2), (1, 2)))]


def _inputs(dtype, n=2, size=(7, 9), cin=3, cout=5, k=3, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((n, *size, cin)), dtype)
    w = jnp.asarray(rng.standard_normal((k, k, cin, cout)) / k, dtype)
    return x, w


def _vjp(f, x, w):
    y, pull = jax.vjp(f, x, w)
    g = jnp.asarray(np.random.default_rng(1).standard_normal(y.shape), y.dtype)
    return (y, *pull(g))


def _close(ours, ref, rtol):
    for a, b in zip(ours, ref, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        scale = float(jnp.max(jnp.abs(b.astype(jnp.float64 if jax.config.jax_enable_x64 else jnp.float32))))
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=0, atol=rtol * scale)


@pytest.mark.parametrize("k, stride, padding", CASES)
def test_matches_lax_under_jit_and_scan(x64, k, stride, padding):
    x, w = _inputs(jnp.float64, k=k)
    strides = (stride, stride)
    ref = jax.jit(lambda x, w: _vjp(lambda a, b: lax.conv_general_dilated(a, b, strides, padding,
                                                                          dimension_numbers=DN), x, w))(x, w)
    ours = lambda a, b: conv_cpu.conv2d_nhwc(a, b, strides, padding)  # noqa: E731
    _close(jax.jit(lambda x, w: _vjp(ours, x, w))(x, w), ref, 1e-13)

    def body(carry, scale):  # two scan iterations; the gradients accumulate in the carry
        y, dx, dw = _vjp(ours, x * scale, w)
        return jax.tree.map(jnp.add, carry, (y, dx, dw)), None

    zeros = tuple(jnp.zeros_like(a) for a in ref)
    summed, _ = jax.jit(lambda: lax.scan(body, zeros, jnp.array([1.0, 1.0])))()
    _close(tuple(a / 2 for a in summed), ref, 1e-13)


# (input size, kernel, stride, padding): outputs smaller than the kernel (im2col forward, col2im input gradient),
# then inputs smaller than the kernel with larger outputs (XLA's forward, col2im input gradient).
TINY = [((2, 2), 3, 1, ((1, 1), (1, 1))), ((1, 3), 3, 1, ((1, 1), (1, 1))), ((3, 3), 3, 2, ((1, 1), (1, 1))),
        ((2, 2), 5, 1, ((2, 2), (2, 2))), ((4, 4), 3, 2, ((1, 1), (1, 1))), ((2, 2), 3, 1, ((2, 2), (2, 2))),
        ((2, 3), 3, 2, ((2, 1), (1, 2)))]
# 1 x 1 outputs (tap_conv): a 1 x 1 input, a stride-2 2 x 2 input, every tap inside, a 1 x 1 kernel, uneven padding
SINGLE = [((1, 1), 3, 1, ((1, 1), (1, 1))), ((2, 2), 3, 2, ((1, 1), (1, 1))), ((3, 3), 3, 3, ((0, 0), (0, 0))),
          ((2, 2), 1, 2, ((0, 0), (0, 0))), ((2, 1), 3, 2, ((0, 1), (1, 1)))]


@pytest.mark.parametrize("size, k, stride, padding", TINY + SINGLE)
def test_smaller_than_kernel_takes_im2col_col2im_or_taps(x64, size, k, stride, padding):
    x, w = _inputs(jnp.float64, size=size, k=k)
    strides = (stride, stride)
    single = conv_cpu._single_output(x.shape, w.shape, strides, padding)
    assert single == ((size, k, stride, padding) in SINGLE)
    assert single or conv_cpu._tiny_output(x.shape, w.shape, strides, padding) or conv_cpu._tiny_input(x.shape,
                                                                                                     w.shape)
    ref = _vjp(lambda a, b: lax.conv_general_dilated(a, b, strides, padding, dimension_numbers=DN), x, w)
    _close(jax.jit(lambda x, w: _vjp(lambda a, b: conv_cpu.conv2d_nhwc(a, b, strides, padding), x, w))(x, w),
           ref, 1e-13)


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_dispatch_string_padding(x64, padding):
    x, w = _inputs(jnp.float64)
    f = lambda impl: lambda a, b: impl(a, b, (1, 1), padding, dimension_numbers=DN)  # noqa: E731
    jaxpr = str(jax.make_jaxpr(f(conv_cpu.conv_general_dilated))(x, w))
    assert "custom_vjp_call" in jaxpr
    _close(_vjp(f(conv_cpu.conv_general_dilated), x, w), _vjp(f(lax.conv_general_dilated), x, w), 1e-13)


def test_dispatch_falls_back_for_dilation_and_groups(x64):
    x, w = _inputs(jnp.float64, cin=4)
    dilated = lambda impl: lambda a, b: impl(a, b, (1, 1), "SAME", rhs_dilation=(2, 2),  # noqa: E731
                                             dimension_numbers=DN)
    assert "custom_vjp_call" not in str(jax.make_jaxpr(dilated(conv_cpu.conv_general_dilated))(x, w))
    _close(_vjp(dilated(conv_cpu.conv_general_dilated), x, w), _vjp(dilated(lax.conv_general_dilated), x, w), 0)
    grouped = lambda impl: lambda a, b: impl(a, b, (1, 1), "SAME", feature_group_count=2,  # noqa: E731
                                             dimension_numbers=DN)
    wg = w[:, :, :2, :4]
    assert "custom_vjp_call" not in str(jax.make_jaxpr(grouped(conv_cpu.conv_general_dilated))(x, wg))


def _layer_pair(cin, cout, k, stride, padding, use_bias, dtype=None, param_dtype=jnp.float32):
    """``layers.conv2d`` and an ``nnx.Conv`` with the same parameters."""
    ours = layers.conv2d(cin, cout, k, stride=stride, padding=padding, use_bias=use_bias, rngs=nnx.Rngs(0),
                         dtype=dtype, param_dtype=param_dtype)
    ref = nnx.Conv(cin, cout, (k, k), strides=stride, padding=((padding, padding),) * 2, use_bias=use_bias,
                   rngs=nnx.Rngs(0), dtype=dtype, param_dtype=param_dtype)
    if use_bias:
        ours.bias[...] = jnp.linspace(-1, 1, cout).astype(param_dtype)
        ref.bias[...] = ours.bias[...]
    ref.kernel[...] = ours.kernel[...]
    return ours, ref


def _layer_grads(layer, x):
    """Output, input gradient and parameter gradients of ``sum(layer(x) * c)`` for a fixed cotangent ``c``."""
    graphdef, params = nnx.split(layer, nnx.Param)

    def loss(params, x):
        y = nnx.merge(graphdef, params)(x)
        c = jnp.cos(jnp.arange(y.size, dtype=jnp.float32).reshape(y.shape)).astype(y.dtype)
        return jnp.sum((y * c).astype(jnp.float32)), y

    (_, y), (gp, gx) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)
    return y, gx, gp


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("k, stride, padding", [(3, 1, 1), (1, 1, 0), (3, 2, 1)])
def test_layer_matches_nnx_conv(x64, use_bias, k, stride, padding):
    ours, ref = _layer_pair(3, 6, k, stride, padding, use_bias, param_dtype=jnp.float64)
    x = jnp.asarray(np.random.default_rng(2).standard_normal((2, 3, 8, 8, 3)))  # [T, N, H, W, C]
    (y, gx, gp), (ry, rgx, rgp) = _layer_grads(ours, x), _layer_grads(ref, x)
    _close((y, gx, gp["kernel"][...]), (ry, rgx, rgp["kernel"][...]), 1e-13)
    if use_bias:
        _close((gp["bias"][...],), (rgp["bias"][...],), 1e-13)


def test_layer_bfloat16_matches_nnx_conv():
    ours, ref = _layer_pair(4, 8, 3, 1, 1, True, dtype=jnp.bfloat16)
    x = jnp.asarray(np.random.default_rng(3).standard_normal((2, 2, 8, 8, 4)), jnp.bfloat16)
    (y, gx, gp), (ry, rgx, rgp) = _layer_grads(ours, x), _layer_grads(ref, x)
    assert y.dtype == gx.dtype == jnp.bfloat16 and gp["kernel"][...].dtype == jnp.float32
    _close((y, gx, gp["kernel"][...], gp["bias"][...]), (ry, rgx, rgp["kernel"][...], rgp["bias"][...]), 2e-2)


def test_data_parallel_sharding_matches_one_device(x64):
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    x, w = _inputs(jnp.float64, n=8, size=(6, 6), cin=4, cout=8)
    f = jax.jit(lambda x, w: _vjp(lambda a, b: conv_cpu.conv2d_nhwc(a, b, (1, 1), ((1, 1), (1, 1))), x, w))
    ref = f(x, w)
    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    ws = jax.device_put(w, NamedSharding(mesh, P()))
    out = f(xs, ws)
    assert out[0].sharding.is_equivalent_to(NamedSharding(mesh, P("data")), 4)  # the batch stayed split
    _close(out, ref, 1e-13)


def _spikes(shape, density, dtype, seed=0, values=(1.0,)):
    """``shape`` with ``density`` of its entries nonzero, each one of ``values``."""
    rng = np.random.default_rng(seed)
    x = (rng.random(shape) < density) * rng.choice(np.asarray(values), shape)
    return jnp.asarray(x, dtype)


# (batch, input size, C_in, C_out, kernel, stride, padding): the models' 3x3 case first; every forward block width
# (64, 32, 16, 8 channels), strides, uneven padding, a 1 x 1 kernel. Then the kernel gradient's passes over its
# padded output gradient: whole images in chunks (10 images of 13 x 13 at 64 channels: two chunks, the last
# partial, two groups' partial sums) and bands of rows of one image (a 30 x 26 image; with a stride; a 5 x 5 kernel).
SPARSE = [(3, (7, 9), 5, 64, 3, 1, ((1, 1), (1, 1))), (3, (6, 6), 3, 32, 3, 2, ((1, 1), (1, 1))),
          (3, (5, 7), 4, 16, 3, 1, ((0, 1), (2, 0))), (3, (8, 5), 6, 8, 1, 1, ((0, 0), (0, 0))),
          (3, (9, 9), 2, 24, 5, 2, ((2, 1), (1, 2))), (3, (6, 7), 3, 40, 4, 3, ((1, 2), (0, 1))),
          (10, (13, 13), 5, 64, 3, 1, ((1, 1), (1, 1))), (2, (30, 26), 3, 64, 3, 1, ((1, 1), (1, 1))),
          (2, (34, 30), 4, 32, 3, 2, ((1, 1), (0, 1))), (2, (30, 30), 3, 64, 5, 1, ((2, 1), (1, 2)))]


@pytest.mark.parametrize("n, size, cin, cout, k, stride, padding", SPARSE)
def test_sparse_kernels_match_lax(x64, n, size, cin, cout, k, stride, padding):
    """``sparse_conv``'s forward and kernel gradient against lax's, float64 (to 1e-13) and float32 (1e-6 of the
    largest value), on spikes, on counts and signed values (a SEW ``ADD``, anything the op may meet)."""
    strides = (stride, stride)
    for dtype, tol in ((jnp.float64, 1e-13), (jnp.float32, 1e-6)):
        for values in ((1.0,), (1.0, 2.0, -0.5)):
            x = _spikes((n, *size, cin), 0.2, dtype, values=values)
            w = _inputs(dtype, cin=cin, cout=cout, k=k)[1]
            y, pull = jax.vjp(lambda a, b: lax.conv_general_dilated(a, b, strides, padding, dimension_numbers=DN),
                              x, w)
            g = jnp.asarray(np.random.default_rng(1).standard_normal(y.shape), dtype)
            ours = (sparse_conv.forward(x, w, y.shape[1:3], strides, padding),
                    sparse_conv.weight_grad(x, g, w.shape, strides, padding))
            _close(ours, (y, pull(g)[1]), tol)


def _sparse_calls(f, *args, target: str = "SnnSparseConv") -> int:
    """How many of ``sparse_conv``'s FFI calls named ``target...`` (the convolution's; ``SnnSparseMatmul``: the
    matmul's) ``f`` traces to (inside their ``cond`` branches); traced afresh (a new function each time: the layout
    contexts are not part of the trace cache's key)."""
    return str(jax.make_jaxpr(lambda *a: f(*a))(*args)).count(target)


def test_op_takes_sparse_kernels_by_density_on_one_device():
    """``conv_general_dilated`` on one device runs the sparse kernels where at most ``MAX_DENSITY`` of the input is
    nonzero and XLA's convolution elsewhere, decided per call: each branch's float32 result is bitwise the one of
    the path it names (their sums run in different orders), and both equal lax's."""
    w = _inputs(jnp.float32, cin=32, cout=32)[1]
    op = lambda impl: lambda a, b: impl(a, b, (1, 1), ((1, 1), (1, 1)), dimension_numbers=DN)  # noqa: E731
    grads = jax.jit(lambda x, w: _vjp(op(conv_cpu.conv_general_dilated), x, w))
    assert _sparse_calls(grads, _spikes((2, 6, 6, 32), 0.1, jnp.float32), w) == 2  # forward, kernel gradient
    for density, sparse in ((0.1, True), (0.35, True), (0.6, False)):
        x = _spikes((2, 6, 6, 32), density, jnp.float32)
        y, dx, dw = grads(x, w)
        g = jnp.asarray(np.random.default_rng(1).standard_normal(y.shape), jnp.float32)
        if sparse:
            expect = (sparse_conv.forward(x, w, (6, 6), (1, 1), ((1, 1),) * 2),
                      sparse_conv.weight_grad(x, g, w.shape, (1, 1), ((1, 1),) * 2))
        else:
            expect = (conv_cpu._forward(x, w, (1, 1), ((1, 1),) * 2, None, None),
                      conv_cpu.weight_grad(x, g, w.shape, (1, 1), ((1, 1),) * 2))
        np.testing.assert_array_equal(np.asarray(y), np.asarray(expect[0]))
        np.testing.assert_array_equal(np.asarray(dw), np.asarray(expect[1]))
        _close((y, dx, dw), _vjp(op(lax.conv_general_dilated), x, w), 1e-6)


def test_sparse_kernels_only_where_they_apply(x64):
    """No sparse call under a split layout (the FFI call has no partitioning rule), for bfloat16, for fewer than
    ``MIN_IN_CHANNELS`` input or output channels not a multiple of 8, for an output smaller than the kernel, or
    within ``sparse_inputs(False)``; ``vmap`` runs them per example."""
    f = lambda x, w: conv_cpu.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=DN)  # noqa
    x, w = _spikes((8, 6, 6, 32), 0.1, jnp.float32), _inputs(jnp.float32, cin=32, cout=8)[1]
    assert _sparse_calls(f, x, w) == 1
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    with activation_rules(mesh, {"batch": "data"}):
        assert _sparse_calls(f, x, w) == 0
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        assert _sparse_calls(f, x, w) == 0
    assert _sparse_calls(f, x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)) == 0
    assert _sparse_calls(f, x, _inputs(jnp.float32, cin=32, cout=6)[1]) == 0
    assert _sparse_calls(f, x[..., :16], _inputs(jnp.float32, cin=16, cout=8)[1]) == 0
    with conv_cpu.sparse_inputs(False):
        assert _sparse_calls(f, x, w) == 0
    assert _sparse_calls(f, x[:, :2, :2], w) == 0  # 2 x 2 output under a 3 x 3 kernel: im2col
    x64_, w64 = x.astype(jnp.float64).reshape(2, 4, 6, 6, 32), w.astype(jnp.float64)
    assert _sparse_calls(jax.vmap(lambda a: f(a, w64)), x64_) == 1
    ref = jax.vmap(lambda a: lax.conv_general_dilated(a, w64, (1, 1), ((1, 1),) * 2, dimension_numbers=DN))(x64_)
    _close((jax.vmap(lambda a: f(a, w64))(x64_),), (ref,), 1e-13)


def test_plan_says_which_path_runs_the_convolutions():
    """``print(plan)`` names the convolutions' and the linear layers' path: the sparse kernels on one device, XLA's
    under a split layout and why; the step compiled under each agrees (tests/helpers' three-step layouts count the
    calls too)."""
    model = CIFAR10DVSVGG(widths=(32,) * 8, image_size=16, rngs=nnx.Rngs(0))
    one = parallel.plan(model, 1, input_shape=(2, 8, 16, 16, 2))
    assert [(r["kind"], r["path"], r["layers"]) for r in one.convolutions] == [
        ("convolutions", "xla", 1), ("convolutions", "sparse", 5), ("convolutions", "xla", 2),
        ("linear layers", "xla", 1)]
    assert "convolutions (1 layer): xla: the sparse kernels take float32 / float64, at least 32 input" in str(one)
    assert "convolutions (5 layers): sparse: sparse-input kernels where at most 40% of the input" in str(one)
    assert "convolutions (2 layers): xla: the output is smaller than the kernel" in str(one)  # 2 x 2 maps last
    assert "linear layers (1 layer): xla: the sparse kernels take float32 / float64, at least 32 input" in str(one)
    dp = parallel.plan(model, 8, mode="dp", input_shape=(2, 8, 16, 16, 2))
    assert "convolutions (8 layers): xla: the layout spans 8 devices" in str(dp)
    assert "linear layers (1 layer): xla: the layout spans 8 devices" in str(dp)
    assert dp.as_dict()["convolutions"] == dp.convolutions
    pp = parallel.plan(model, jax.make_mesh((2,), ("stage",), devices=jax.devices()[:2]), mode="pp",
                       global_batch_size=8, input_shape=(2, 8, 16, 16, 2))  # its trace leaves stage out
    assert "convolutions (8 layers): xla: the layout spans 2 devices" in str(pp)


def test_cpu_compiler_options_keep_float32_convolutions_off_ynnpack():
    """XLA:CPU's own default hands a 3x3 conv of this size to YNNPACK; a float32 step's ``compiler_options`` keep it
    on Eigen, a float64 step's are XLA's default (``tests/test_xla_options.py`` compiles the library's steps).

    (Compiled only, never run.) If the first assertion fails, XLA's default changed and the option needs a look.
    """
    x = jax.ShapeDtypeStruct((2, 8, 8, 32), jnp.float32)  # small: _vjp's cotangent is a constant of y's size
    w = jax.ShapeDtypeStruct((3, 3, 32, 32), jnp.float32)

    def ynn_convolutions(options):
        step = jax.jit(lambda x, w: _vjp(lambda a, b: conv_cpu.conv2d_nhwc(a, b, (1, 1), ((1, 1), (1, 1))), x, w),
                       compiler_options=options)
        text = step.lower(x, w).compile().as_text()
        return [line for line in text.splitlines() if "ynn_fusion" in line and 'conv_general_dilated"' in line]

    assert ynn_convolutions(None)
    options = conv_cpu.compiler_options((x, w), "cpu")
    assert options == conv_cpu.CPU_CONV_OPTIONS and not ynn_convolutions(options)
    assert conv_cpu.compiler_options((x, w), "gpu") is None
    assert conv_cpu.compiler_options((x, jnp.float64), "cpu") is None
    assert conv_cpu.compiler_options({"w": jax.ShapeDtypeStruct((3,), jnp.float64)}, "cpu") is None


def _linear_pair(dtype):
    ours = layers.linear(6, 5, rngs=nnx.Rngs(0), param_dtype=dtype)
    ref = nnx.Linear(6, 5, rngs=nnx.Rngs(0), param_dtype=dtype)
    ref.kernel[...], ref.bias[...] = ours.kernel[...], ours.bias[...]
    return ours, ref


def test_linear_merges_leading_dims_equal_to_nnx_and_no_transposed_copy(x64):
    ours, ref = _linear_pair(jnp.float64)
    x = jnp.asarray(np.random.default_rng(4).standard_normal((3, 4, 6)))  # [T, N, F]
    (y, gx, gp), (ry, rgx, rgp) = _layer_grads(ours, x), _layer_grads(ref, x)
    _close((y, gx, gp["kernel"][...], gp["bias"][...]), (ry, rgx, rgp["kernel"][...], rgp["bias"][...]), 1e-13)
    with activation_rules(jax.make_mesh((8,), ("data",)), {"batch": "data"}):
        assert not layers.conv._merges_leading_dims(x)  # a split batch stays split: nnx's dot over [T, N, F]
    assert layers.conv._merges_leading_dims(x) and not layers.conv._merges_leading_dims(x[0])

    # float32 as the peers bench compiles it: the weight gradient reads the output gradient as it is (over [T, N, F]
    # contracted as two axes XLA:CPU copies it to [out, T*N] first)
    graph, params = nnx.split(layers.linear(64, 48, rngs=nnx.Rngs(0)))
    xs = jax.ShapeDtypeStruct((5, 8, 64), jnp.float32)
    step = jax.jit(jax.grad(lambda p, x: jnp.sum(jnp.sin(nnx.merge(graph, p)(x)))),
                   compiler_options=conv_cpu.compiler_options(xs, "cpu"))
    assert "f32[48,40]" not in step.lower(params, xs).compile().as_text()


def _matmul_calls(f, *args) -> int:
    return _sparse_calls(f, *args, target="SnnSparseMatmul")


# (rows, C_in, C_out): rows and channels that fill no work item evenly; blocks of 8, 16 and 64 output columns.
MATMUL = [(40, 64, 48), (7, 33, 8), (130, 96, 200), (300, 40, 128)]


@pytest.mark.parametrize("rows, cin, cout", MATMUL)
def test_sparse_matmul_matches_lax(x64, rows, cin, cout):
    """``sparse_conv``'s matmul and its kernel gradient against XLA's dot, float64 (1e-13) and float32 (1e-6 of the
    largest value), on spikes and on signed counts, with rows and columns of zeros only."""
    for dtype, tol in ((jnp.float64, 1e-13), (jnp.float32, 1e-6)):
        for values in ((1.0,), (1.0, 2.0, -0.5)):
            x = _spikes((rows, cin), 0.2, dtype, values=values).at[1].set(0).at[:, 2].set(0)
            w = jnp.asarray(np.random.default_rng(2).standard_normal((cin, cout)), dtype)
            g = jnp.asarray(np.random.default_rng(3).standard_normal((rows, cout)), dtype)
            _close((sparse_conv.matmul(x, w), sparse_conv.matmul_weight_grad(x, g)), (x @ w, x.T @ g), tol)


def test_linear_layers_take_the_sparse_matmul_by_density(x64):
    """``Linear`` / ``linear_general`` layers on one device run the sparse matmul for the forward and the kernel
    gradient where at most ``MAX_DENSITY`` of the input is nonzero (bitwise that path's), XLA's dot otherwise; both
    equal nnx's layers. None under a split layout, for too few inputs, within ``sparse_inputs(False)`` or for a
    contraction other than a linear layer's."""
    for dtype, tol in ((jnp.float64, 1e-13), (jnp.float32, 1e-6)):
        ours = layers.linear(64, 48, rngs=nnx.Rngs(0), param_dtype=dtype)
        ref = nnx.Linear(64, 48, rngs=nnx.Rngs(0), param_dtype=dtype)
        ref.kernel[...], ref.bias[...] = ours.kernel[...], ours.bias[...]
        for density in (0.1, 0.35, 0.6):
            x = _spikes((3, 5, 64), density, dtype, values=(1.0, 2.0))
            (y, gx, gp), (ry, rgx, rgp) = _layer_grads(ours, x), _layer_grads(ref, x)
            _close((y, gx, gp["kernel"][...], gp["bias"][...]), (ry, rgx, rgp["kernel"][...], rgp["bias"][...]), tol)
            if density <= sparse_conv.MAX_DENSITY:
                x2 = x.reshape(15, 64)
                g = jnp.cos(jnp.arange(y.size, dtype=jnp.float32)).astype(dtype).reshape(15, 48)  # _layer_grads'
                np.testing.assert_array_equal(np.asarray(y), np.asarray(
                    (sparse_conv.matmul(x2, ours.kernel[...]) + ours.bias[...]).reshape(y.shape)))
                np.testing.assert_array_equal(np.asarray(gp["kernel"][...]),
                                              np.asarray(sparse_conv.matmul_weight_grad(x2, g)))

    x = _spikes((3, 5, 64), 0.1, jnp.float32)
    f = lambda m, x: m(x)  # noqa: E731
    assert _matmul_calls(f, ours, x) == 1
    assert _matmul_calls(lambda m, x: jax.grad(lambda m: jnp.sum(m(x)))(m), ours, x) == 2
    general = layers.linear_general(64, (2, 8), rngs=nnx.Rngs(0))
    assert _matmul_calls(f, general, x) == 1
    heads = layers.linear_general((4, 16), 8, rngs=nnx.Rngs(0))  # [heads, head_dim] -> D, as attention's output
    assert _matmul_calls(f, heads, x.reshape(3, 5, 4, 16)) == 1
    ref = jnp.einsum("tnhd,hdo->tno", x.reshape(3, 5, 4, 16), heads.kernel[...]) + heads.bias[...]
    _close((heads(x.reshape(3, 5, 4, 16)),), (ref,), 1e-6)
    _close((general(x),), (jnp.einsum("tni,ihd->tnhd", x, general.kernel[...]) + general.bias[...],), 1e-6)
    with activation_rules(jax.make_mesh((8,), ("data",)), {"batch": "data"}):
        assert _matmul_calls(f, ours, x) == 0
    with conv_cpu.sparse_inputs(False):
        assert _matmul_calls(f, ours, x) == 0
    assert _matmul_calls(f, layers.linear(16, 48, rngs=nnx.Rngs(0)), x[..., :16]) == 0
    batched = lambda x, w: layers.linear_cpu.dot_general(x, w, (((2,), (1,)), ((0,), (0,))))  # noqa: E731
    assert _matmul_calls(batched, x, jnp.ones((3, 64, 8))) == 0
