"""NIR export / import: BatchNorm folding, round trips, refusals, and SpikingJelly's, snnTorch's and Norse's NIR
import of our files."""
import copy
import os
import re
import subprocess

import grimp
import jax
import jax.numpy as jnp
import nir
import numpy as np
import pytest
from flax import nnx
from helpers import F64, deploy_model, gesture_sequential, randomize_batch_norm

from snnjax import layers
from snnjax.deploy import nir as nir_lib
from snnjax.deploy.calls import UnsupportedModelError
from snnjax.deploy.nir import NIRError, fold_batchnorm, from_nir, to_nir
from snnjax.models import SpikingMLP
from snnjax.models.sequential import Sequential
from snnjax.neurons import S2NN, ATan, CUBALIFNode, LIFNode, NonSpikingIFNode, NonSpikingLIFNode


def gesture_net():
    net = gesture_sequential((16, 16, 2), channels=8, num_classes=3, blocks=2, hidden=16, pool="avg",
                             rngs=nnx.Rngs(2), **F64)
    randomize_batch_norm(net)
    net.layers[10].kernel[...] = 4.0 * np.asarray(net.layers[10].kernel[...])  # the hidden layer: drive to fire
    return net, (4, 2, 16, 16, 2), 3.0


def model_and_input(name):
    model, shape, scale = gesture_net() if name == "dvs_gesture" else deploy_model(name)
    model.eval()
    return model, scale * jax.random.uniform(jax.random.key(3), shape, jnp.float64)


def test_batchnorm_folds_into_the_conv_and_linear_before_it(x64):
    rngs = nnx.Rngs(0)
    x = jax.random.normal(jax.random.key(1), (3, 6, 6, 4), jnp.float64)
    conv = layers.conv2d(4, 5, 3, padding=1, rngs=rngs, **F64)
    fc = layers.linear(4, 5, rngs=rngs, **F64)
    for layer, inputs in ((conv, x), (fc, x[:, 0, 0])):
        bn = layers.BatchNorm(5, **F64)
        randomize_batch_norm(bn)
        bn.use_running_average = True
        kernel, bias = fold_batchnorm(np.asarray(layer.kernel[...]), np.asarray(layer.bias[...]), bn)
        layer_folded = nnx.clone(layer)
        layer_folded.kernel[...], layer_folded.bias[...] = jnp.asarray(kernel), jnp.asarray(bias)
        np.testing.assert_allclose(layer_folded(inputs), bn(layer(inputs)), rtol=0, atol=1e-12)
        assert float(jnp.abs(bn(layer(inputs)) - layer(inputs)).max()) > 0.1  # the statistics do something


@pytest.mark.parametrize("name", ["mlp", "vgg", "dvs_gesture", "user"])
def test_round_trip_through_a_nir_file_reproduces_outputs(x64, tmp_path, name):
    model, x = model_and_input(name)
    graph = to_nir(model, x.shape[2:])
    assert not any(type(n).__name__ == "BatchNorm" for n in graph.nodes.values())
    nir.write(tmp_path / "model.nir", graph)
    back = from_nir(tmp_path / "model.nir", dtype=jnp.float64, param_dtype=jnp.float64)
    assert isinstance(back, Sequential)
    want = jax.jit(lambda m, x: m(x))(model, x)
    assert float(jnp.abs(want).max()) > 0.1
    np.testing.assert_allclose(jax.jit(lambda m, x: m(x))(back, x), want, rtol=0, atol=1e-12)
    kinds = [type(n).__name__ for n in graph.nodes.values()]
    expected = {"mlp": ["Input", "Flatten", "Affine", "LIF", "Affine", "LIF", "Affine", "Output"],
                "vgg": ["Input", "Conv2d", "LIF", "AvgPool2d", "Conv2d", "LIF", "Conv2d", "LIF", "AvgPool2d", "Conv2d",
                        "LIF", "AvgPool2d", "Flatten", "Affine", "Output"]}
    if name in expected:
        assert kinds == expected[name]


def test_neuron_parameters_and_training_settings_travel(tmp_path):
    model = SpikingMLP(4, (3,), 2, spiking_neuron="IF", v_threshold=0.7, v_reset=-0.1,
                       surrogate_function=S2NN(3.0, 0.5), detach_reset=True, rngs=nnx.Rngs(0))
    graph = to_nir(model, (4,))
    node = graph.nodes["neurons_0"]
    assert isinstance(node, nir.IF) and np.all(node.r == 1e4) and np.all(node.v_threshold == 0.7)
    nir.write(tmp_path / "if.nir", graph)
    neuron = from_nir(tmp_path / "if.nir").layers[1]
    assert (neuron.kind, neuron.v_threshold, neuron.v_reset) == ("IF", 0.7, -0.1)
    assert neuron.surrogate_function == S2NN(alpha=3.0, beta=0.5) and neuron.detach_reset
    lif = to_nir(SpikingMLP(4, (3,), 2, tau=4.0, decay_input=False, rngs=nnx.Rngs(0)), (4,)).nodes["neurons_0"]
    assert np.allclose(lif.tau, 4e-4) and np.all(lif.r == 4.0) and np.all(lif.v_leak == 0.0)


def cuba_net(v_reset: float = -0.1):
    """Linear -> CUBA-LIF -> Linear -> CUBA-LIF (``v_reset``) -> Linear -> leaky-integrator readout -> Linear ->
    integrator, float64, with inputs [T=12, N=2, 6] that make both CUBA-LIF layers fire."""
    rngs = nnx.Rngs(0)
    net = Sequential(layers.linear(6, 16, rngs=rngs, **F64),
                     CUBALIFNode(c_decay=0.8, v_decay=0.9, v_threshold=0.7, surrogate_function=ATan(3.0),
                                 detach_reset=True, step_mode="m"),
                     layers.linear(16, 8, rngs=rngs, **F64), CUBALIFNode(v_reset=v_reset, step_mode="m"),
                     layers.linear(8, 4, rngs=rngs, **F64), NonSpikingLIFNode(tau=3.0),
                     layers.linear(4, 3, rngs=rngs, **F64), NonSpikingIFNode())
    return net, 2.0 * jax.random.uniform(jax.random.key(1), (12, 2, 6), jnp.float64)


@jax.jit
def run_cuba(net, x):
    """``cuba_net``'s outputs and its first CUBA-LIF's firing rate (one compile for nets with equal graphdefs)."""
    return net(x), net.layers[1](net.layers[0](x)).mean()


def test_cuba_lif_and_readouts_round_trip_through_a_nir_file(x64, tmp_path):
    net, x = cuba_net()
    graph = to_nir(net, (6,))
    kinds = [type(n).__name__ for n in graph.nodes.values()]
    assert kinds == ["Input", "Affine", "CubaLIF", "Affine", "CubaLIF", "Affine", "LI", "Affine", "I", "Output"]
    cuba, li, i = graph.nodes["layers_1"], graph.nodes["layers_5"], graph.nodes["layers_7"]
    np.testing.assert_allclose(cuba.tau_syn, 5e-4, rtol=1e-12)  # dt / (1 - c_decay)
    np.testing.assert_allclose(cuba.tau_mem, 1e-3, rtol=1e-12)
    np.testing.assert_allclose(cuba.w_in, 5.0, rtol=1e-12)  # tau_syn / dt: the Euler step adds the input unscaled
    np.testing.assert_allclose(cuba.r, 10.0, rtol=1e-12)
    assert np.all(cuba.v_leak == 0) and np.all(cuba.v_threshold == 0.7) and np.all(graph.nodes["layers_3"].v_reset
                                                                                   == -0.1)
    assert np.allclose(li.tau, 3e-4) and np.all(li.r == 1) and np.all(li.v_leak == 0) and np.all(i.r == 1e4)
    nir.write(tmp_path / "cuba.nir", graph)
    back = from_nir(tmp_path / "cuba.nir", dtype=jnp.float64, param_dtype=jnp.float64)
    assert [type(m).__name__ for m in back.layers[1::2]] == ["CUBALIFNode", "CUBALIFNode", "NonSpikingLIFNode",
                                                              "NonSpikingIFNode"]
    first = back.layers[1]
    assert (first.c_decay, first.v_decay, first.surrogate_function, first.detach_reset) == (
        pytest.approx(0.8, abs=1e-15), pytest.approx(0.9, abs=1e-15), ATan(3.0), True)
    (want, rate), (got, _) = run_cuba(net, x), run_cuba(back, x)
    assert 0.05 < float(rate) < 0.6 and float(jnp.abs(want).max()) > 0.1  # the hidden layer fires, not always
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_what_the_new_nodes_cannot_carry_is_refused(x64):
    net, _ = cuba_net()
    with pytest.raises(NIRError, match="decode='max-mem' reduces the potentials over time"):
        to_nir(Sequential(layers.linear(6, 4, rngs=nnx.Rngs(0)), NonSpikingLIFNode(decode="max-mem")), (6,))
    with pytest.raises(NIRError, match="soft reset"):
        to_nir(Sequential(layers.linear(6, 4, rngs=nnx.Rngs(0)), CUBALIFNode(v_reset=None, step_mode="m")), (6,))
    with pytest.raises(NIRError, match=r"c_decay=1.0 is outside \[0, 1\)"):
        to_nir(Sequential(layers.linear(6, 4, rngs=nnx.Rngs(0)), CUBALIFNode(c_decay=1.0, step_mode="m")), (6,))
    cases = [  # (node, field, value, what the error says): shapes, NaN, and parameters outside the mapping
        ("layers_1", "tau_syn", np.full(16, np.nan), "layers_1: tau_syn holds NaN"),
        ("layers_1", "w_in", np.ones(16), "layers_1: CubaLIF w_in=1.0 must be tau_syn/dt=5"),
        ("layers_1", "r", np.ones(16), "layers_1: CubaLIF r=1.0 must be tau_mem/dt=10"),
        ("layers_1", "v_leak", np.full(16, 0.1), "layers_1: CubaLIF v_leak must be 0"),
        ("layers_1", "tau_mem", np.full(16, 5e-5), "layers_1: CubaLIF tau_mem/dt = 0.5 must be >= 1"),
        ("layers_1", "v_threshold", np.ones(17), "layers_1: v_threshold of shape (17,) does not fit its input (16,)"),
        ("layers_5", "tau", np.full((2, 4), 3e-4), "layers_5: tau of shape (2, 4) does not fit its input (4,)"),
        ("layers_5", "r", np.full(4, np.inf), "layers_5: r holds NaN, infinite"),
        ("layers_5", "v_leak", np.ones(4), "layers_5: LI v_leak must be 0"),
        ("layers_7", "r", np.ones(3), "layers_7: I with r=1.0 at dt=0.0001"),
    ]
    intact = to_nir(net, (6,))
    for node, field, value, reason in cases:
        graph = copy.deepcopy(intact)
        setattr(graph.nodes[node], field, value)
        with pytest.raises(NIRError, match=re.escape(reason)):
            from_nir(graph)


def test_a_scale_after_an_affine_layer_folds_into_it(x64):
    """``nir.Scale`` (``y = x * s``) right after an affine layer becomes part of its weights; anywhere else it is
    refused (snnjax has no scaling layer)."""
    net, x = cuba_net()
    graph = to_nir(net, (6,))
    scale = np.linspace(0.5, 1.5, 16)
    graph.nodes["scale"] = nir.Scale(scale=scale)
    graph.edges = [e for e in graph.edges if e != ("layers_0", "layers_1")] + [("layers_0", "scale"),
                                                                               ("scale", "layers_1")]
    back = from_nir(graph, dtype=jnp.float64, param_dtype=jnp.float64)
    net.layers[0].kernel[...] = net.layers[0].kernel[...] * scale
    net.layers[0].bias[...] = net.layers[0].bias[...] * scale
    np.testing.assert_allclose(run_cuba(back, x)[0], run_cuba(net, x)[0], rtol=0, atol=1e-12)
    graph.edges = [e for e in graph.edges if e[0] not in ("layers_0", "layers_1", "scale")] + [
        ("layers_0", "layers_1"), ("layers_1", "scale"), ("scale", "layers_2")]
    with pytest.raises(NIRError, match="a Scale folds only into the affine or convolution layer right before it"):
        from_nir(graph)


class Residual(nnx.Module):
    def __init__(self):
        self.fc, self.lif = nnx.Linear(2, 2, rngs=nnx.Rngs(0)), LIFNode(step_mode="m")

    def __call__(self, x):
        return x + self.lif(self.fc(x))


def test_what_nir_cannot_carry_is_refused():
    with pytest.raises(NIRError, match="soft reset"):
        to_nir(SpikingMLP(4, (3,), 2, v_reset=None, rngs=nnx.Rngs(0)), (4,))
    maxpool = gesture_sequential((8, 8, 2), channels=2, num_classes=2, blocks=1, hidden=4, pool="max",
                                 rngs=nnx.Rngs(0))
    with pytest.raises(NIRError, match="no max pooling node"):
        to_nir(maxpool, (8, 8, 2))
    with pytest.raises(UnsupportedModelError, match="Residual is not a chain of layers: its output is not the "
                       "output of lif"):
        to_nir(Residual(), (2,))
    graph = to_nir(SpikingMLP(4, (3,), 2, rngs=nnx.Rngs(0)), (4,))
    graph.nodes["neurons_0"].v_threshold = np.array([1.0, 1.0, 0.5])
    with pytest.raises(NIRError, match="v_threshold differs between neurons"):
        from_nir(graph)
    graph = to_nir(SpikingMLP(4, (3,), 2, rngs=nnx.Rngs(0)), (4,))
    graph.nodes["neurons_0"] = nir.Threshold(threshold=np.ones(3))
    with pytest.raises(NIRError, match="Threshold, which from_nir does not map"):
        from_nir(graph)
    graph.edges.append(("fcs_0", "head"))
    with pytest.raises(NIRError, match="chain"):
        from_nir(graph)


def _sj_python():
    """An interpreter with torch, spikingjelly and nir: $SNNJAX_SJ_PYTHON, else none."""
    return os.environ.get("SNNJAX_SJ_PYTHON")


SJ_IMPORT = """
import sys, numpy as np, torch
from spikingjelly.activation_based.nir_exchange import import_from_nir
for path in sys.argv[1:]:
    net = import_from_nir(path + ".nir", dt=1e-4, dtype=torch.float64, step_mode="m")
    x = np.load(path + "_x.npy")
    x = x.transpose(0, 1, 4, 2, 3) if x.ndim == 5 else x  # [T, N, H, W, C] -> SpikingJelly's [T, N, C, H, W]
    with torch.no_grad():
        y, _ = net(torch.from_numpy(np.ascontiguousarray(x)))
    np.save(path + "_y.npy", y.numpy())
"""


@pytest.mark.skipif(_sj_python() is None, reason="no interpreter with spikingjelly and nir (SNNJAX_SJ_PYTHON)")
def test_spikingjelly_imports_our_nir_files_and_reproduces_outputs(x64, tmp_path):
    names, want = ["mlp", "vgg", "dvs_gesture", "user"], {}
    for name in names:
        model, x = model_and_input(name)
        nir.write(tmp_path / f"{name}.nir", to_nir(model, x.shape[2:]))
        np.save(tmp_path / f"{name}_x.npy", np.asarray(x))
        want[name] = jax.jit(lambda m, x: m(x))(model, x)
    result = subprocess.run([_sj_python(), "-c", SJ_IMPORT, *(str(tmp_path / n) for n in names)],
                            capture_output=True, text=True, timeout=300)
    if result.returncode and "No module named 'nir" in result.stderr:
        pytest.skip(f"{_sj_python()} lacks nir / nirtorch (pip install nir nirtorch there)")
    assert result.returncode == 0, result.stderr[-3000:]
    for name in names:
        np.testing.assert_allclose(np.load(tmp_path / f"{name}_y.npy"), want[name], rtol=0, atol=1e-12)


CONSUMERS = """
import sys, numpy as np, torch, nir
path, out = sys.argv[1], {}
x = np.load(path + "_x.npy")
from spikingjelly.activation_based.nir_exchange import import_from_nir
with torch.no_grad():
    out["spikingjelly"] = import_from_nir(path + ".nir", dt=1e-4, dtype=torch.float64, step_mode="m")(
        torch.from_numpy(x))[0].numpy()
    from snntorch.import_nir import import_from_nir as snntorch_import  # float32, dt = 1e-4
    net = snntorch_import(nir.read(path + ".nir"))
    out["snntorch"] = np.stack([net(torch.from_numpy(xt).float())[0].numpy() for xt in x])
    import norse.torch  # float32, stepped with its state
    net, state, ys = norse.torch.from_nir(nir.read(path + ".nir"), dt=1e-4), None, []
    for xt in x:
        y, state = net(torch.from_numpy(xt).float(), state)
        ys.append(y.numpy())
    out["norse"] = np.stack(ys)
np.savez(path + "_y.npz", **out)
"""


@pytest.mark.skipif(_sj_python() is None, reason="no interpreter with spikingjelly, snntorch, norse and nir "
                    "(SNNJAX_SJ_PYTHON)")
def test_other_nir_tools_run_our_cuba_lif_graph(x64, tmp_path):
    """SpikingJelly (float64), snnTorch and Norse (float32) load a CUBA-LIF graph of ours and give our outputs.
    None of the three imports NIR's LI or I, so the graph ends with an affine layer on the spikes; snnTorch and Norse
    start from 0 and reset to 0 whatever the graph's v_reset, so it is 0 here."""
    net, x = cuba_net(v_reset=0.0)
    net = Sequential(*list(net.layers)[:5])  # up to the second CUBA-LIF's affine read-out
    nir.write(tmp_path / "cuba.nir", to_nir(net, (6,)))
    np.save(tmp_path / "cuba_x.npy", np.asarray(x))
    want = np.asarray(net(x))
    result = subprocess.run([_sj_python(), "-c", CONSUMERS, str(tmp_path / "cuba")], capture_output=True, text=True,
                            timeout=300)
    if result.returncode and "No module named" in result.stderr:
        pytest.skip(f"{_sj_python()} lacks one of nir, nirtorch, snntorch, norse: {result.stderr[-200:]}")
    assert result.returncode == 0, result.stderr[-3000:]
    got = np.load(tmp_path / "cuba_y.npz")
    assert float(np.abs(want).max()) > 0.5
    np.testing.assert_allclose(got["spikingjelly"], want, rtol=0, atol=1e-12)
    for tool in ("snntorch", "norse"):
        np.testing.assert_allclose(got[tool], want, rtol=0, atol=1e-6, err_msg=tool)


def test_only_the_nir_module_imports_nir():
    """The ``nir`` package is optional: only ``snnjax.deploy.nir`` imports it."""
    graph = grimp.build_graph("snnjax", include_external_packages=True)
    assert graph.find_modules_that_directly_import("nir") == {"snnjax.deploy.nir"}


def set_dataset(path, name: str, value=None, *, shape=None, edges=None):
    """Replace dataset ``node/nodes/<name>`` of a NIR file (``value``, or an unwritten compressed one of ``shape``
    that takes no space: a small file declaring a huge array), or its edges."""
    import h5py  # noqa: PLC0415

    with h5py.File(path, "r+") as f:
        if edges is not None:
            del f["node/edges"]
            f["node/edges"] = np.array(edges, dtype=object).astype("S")
            return
        del f[f"node/nodes/{name}"]
        if shape is None:
            f[f"node/nodes/{name}"] = value
        else:
            f.create_dataset(f"node/nodes/{name}", shape=shape, dtype="f4", chunks=(1, 1 << 20), compression="gzip")


@pytest.fixture
def mlp_file(tmp_path):
    """A NIR file of input (8,) -> fcs_0 (4x8) -> LIF neurons_0 -> head (2x4) -> output."""
    path = tmp_path / "mlp.nir"
    nir.write(path, to_nir(SpikingMLP(8, (4,), 2, rngs=nnx.Rngs(0)), (8,)))
    return path


NIR_CASES = {  # name: (damage, what the error says)
    "input (2e8,) before a 4x8 weight": (lambda p: set_dataset(p, "input/shape", np.array([200_000_000])),
                                         "type mismatch: input.output: [[200000000]] -> fcs_0.input: [[8]]"),
    "a 4x1e8 weight in a small file": (lambda p: set_dataset(p, "fcs_0/weight", shape=(4, 100_000_000)),
                                       "its arrays declare 40000"),
    "a zero input shape": (lambda p: set_dataset(p, "input/shape", np.array([0])),
                           "type mismatch: input.output: [[0]]"),
    "a negative input shape": (lambda p: set_dataset(p, "input/shape", np.array([-8])),
                               "type mismatch: input.output: [[-8]]"),
    "an edge to a missing node": (lambda p: set_dataset(p, "", edges=[("input", "fcs_0"), ("fcs_0", "gone")]),
                                  "not a readable NIR graph"),
    "a NaN threshold": (lambda p: set_dataset(p, "neurons_0/v_threshold", np.full(4, np.nan)),
                        "neurons_0: v_threshold holds NaN"),
    "an infinite weight": (lambda p: set_dataset(p, "head/weight", np.full((2, 4), np.inf, np.float32)),
                           "head: weight holds NaN, infinite"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:1000]), "not a readable HDF5 file"),
    "not HDF5": (lambda p: p.write_bytes(b"\x89HDF nope" * 100), "not a readable HDF5 file"),
    "HDF5 without a graph": (lambda p: set_dataset(p, "", edges=[]) or __import__("h5py").File(p, "w").close(),
                             "no 'node' group: not a NIR file"),
}


@pytest.mark.parametrize("case", NIR_CASES)
def test_damaged_nir_files_are_refused_naming_the_file(mlp_file, case):
    damage, reason = NIR_CASES[case]
    from_nir(mlp_file)
    damage(mlp_file)
    with pytest.raises(NIRError, match=re.escape(f"{mlp_file}: ") + ".*" + re.escape(reason)):
        from_nir(mlp_file)


@pytest.mark.parametrize(("input_shape", "reason"), [
    ((200_000_000,), "input: 200000000 elements, over max_elements=134217728"),
    ((20_000_000,), "fcs_0: weight (4, 8) does not fit its input (20000000,)"),
    ((0,), "input shape [0] is not a list of positive integers"),
    ((-8,), "input shape [-8] is not a list of positive integers"),
    ((8, 4, 4), "fcs_0: weight (4, 8) does not fit its input (8, 4, 4)"),
])
def test_graph_shapes_are_checked_before_a_model_is_built(input_shape, reason):
    """An in-memory graph is not type-checked by nir.read: from_nir checks each shape itself."""
    graph = to_nir(SpikingMLP(8, (4,), 2, rngs=nnx.Rngs(0)), (8,))
    graph.nodes["input"] = nir.Input(input_type=np.array(input_shape))
    with pytest.raises(NIRError, match=re.escape(reason)):
        from_nir(graph)


@pytest.mark.parametrize(("child", "reason"), [
    ("import time\ndef read(path):\n    time.sleep(60)\n", "reading it did not finish within read_timeout=1 s"),
    ("import os, signal\ndef read(path):\n    os.kill(os.getpid(), signal.SIGSEGV)\n",
     "reading it crashed the HDF5 library (signal 11"),
    ("def read(path):\n    bytearray(3 << 30)\n", "reading it asked for more memory than a trial read allows"),
])
def test_a_file_that_hangs_or_crashes_the_hdf5_library_is_refused(mlp_file, tmp_path, monkeypatch, child, reason):
    """from_nir reads the file in a child process first (libhdf5 spins on some damaged heaps): here a child that
    hangs or crashes as libhdf5 did on a fuzzed file, or allocates past the child's cap (libhdf5 asked 3.5 GB for a
    fuzzed 9 KB SHD file)."""
    script = tmp_path / "child.py"
    script.write_text(child)
    monkeypatch.setattr(nir_lib, "_TRIAL_READ", f"{script}:read")
    with pytest.raises(NIRError, match=re.escape(f"{mlp_file}: {reason}")):
        from_nir(mlp_file, read_timeout=1)
