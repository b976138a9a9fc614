"""AC / MAC counts: an independent count (spikes x fan-out, by loops), the CLI, and SpikingJelly's op_counter."""
import json
import os
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import F64, deploy_model, randomize_batch_norm

from snnjax import layers
from snnjax.deploy import energy
from snnjax.deploy.calls import layer_chain
from snnjax.deploy.opcount import count_ops
from snnjax.models.sequential import Sequential
from snnjax.neurons.modules import BaseNode


def fanout_map(size: int, k: int, stride: int, pad: int) -> np.ndarray:
    """How many output positions of a conv (one axis) read each input position, by enumeration."""
    out = (size + 2 * pad - k) // stride + 1
    fan = np.zeros(size, np.int64)
    for o in range(out):
        for i in range(k):
            pos = o * stride + i - pad
            if 0 <= pos < size:
                fan[pos] += 1
    return fan


def independent_counts(model, x):
    """Per conv / linear layer: (kind of input, AC per example, dense MAC per example), from each layer's input
    spikes before any pooling, counted with loops over the geometry."""
    seen = {"spikes": None, "pool": 1}
    counts = {}
    for call in layer_chain(model, x)[1]:
        m, inputs, outputs = call.module, call.x, call.y
        if isinstance(m, BaseNode):
            seen.update(spikes=np.asarray(outputs), pool=1)
        elif isinstance(m, layers.AvgPool2d) and seen["spikes"] is not None:
            seen["pool"] *= m.kernel_size
        elif isinstance(m, (nnx.Conv, nnx.Linear)):
            conv = isinstance(m, nnx.Conv)
            t, n = inputs.shape[:2]
            dense = t * np.prod(outputs.shape[2:]) * (m.in_features * (np.prod(m.kernel_size) if conv else 1))
            if seen["spikes"] is None:
                counts[call.name] = ("real", 0, dense)
                continue
            s, p = seen["spikes"], seen["pool"]
            if not conv:
                ac = s[..., :s.shape[2] // p * p, :s.shape[3] // p * p, :].sum() if s.ndim == 5 else s.sum()
                ac = ac * m.out_features
            else:
                (k, _), (pad, _), stride = m.kernel_size, m.padding[0], m.strides
                stride = stride if isinstance(stride, int) else stride[0]
                h, w = inputs.shape[2:4]
                fh, fw = fanout_map(h, k, stride, pad), fanout_map(w, k, stride, pad)
                fan = np.zeros(s.shape[2:4], np.int64)  # each pre-pool cell takes its pooled cell's fan-out
                fan[:h * p, :w * p] = np.repeat(np.repeat(np.outer(fh, fw), p, 0), p, 1)
                ac = np.einsum("tnhwc,hw->", s, fan) * m.out_features
            counts[call.name] = ("pooled spikes" if p > 1 else "spikes", ac / n, dense)
            seen.update(spikes=None, pool=1)
        elif isinstance(m, layers.BatchNorm):
            seen.update(spikes=None)
    return counts


def strided_net():
    """Convs with stride 2, no padding and padding 2 after spikes, a linear layer after a flatten."""
    specs = [{"kind": "conv", "features": 6, "kernel": 3, "padding": 1}, {"kind": "batchnorm"},
             {"kind": "neuron", "type": "IF"}, {"kind": "conv", "features": 5, "kernel": 3, "stride": 2},
             {"kind": "neuron", "type": "LIF", "tau": 2.0}, {"kind": "conv", "features": 4, "kernel": 5, "padding": 2},
             {"kind": "neuron", "type": "IF", "v_threshold": 0.5}, {"kind": "flatten"},
             {"kind": "linear", "features": 3}]
    net = Sequential.from_specs((11, 11, 2), specs, rngs=nnx.Rngs(4), **F64)
    randomize_batch_norm(net)
    return net


@pytest.mark.parametrize("name", ["vgg", "strided"])
def test_counts_match_an_independent_count_of_spikes_times_fan_out(x64, name):
    if name == "vgg":
        model, shape, scale = deploy_model("vgg")
    else:
        model, shape, scale = strided_net(), (3, 4, 11, 11, 2), 3.0
    model.eval()
    x = scale * jax.random.uniform(jax.random.key(5), shape, jnp.float64)
    report = count_ops(model, x)
    want = independent_counts(model, x)
    assert [r.name for r in report.layers] == list(want)
    for r in report.layers:
        kind, ac, dense = want[r.name]
        assert r.input == kind and r.dense_ops == dense
        assert (r.ac, r.mac) == ((ac, 0.0) if kind != "real" else (0.0, dense)), r.name
        assert kind == "real" or r.ac > 0, f"{r.name} got no spikes: the check would be void"
    assert report.energy_pj() == pytest.approx(0.9 * report.ac + 4.6 * report.mac)
    assert report.energy_pj(e_ac=0.03, e_mac=0.23) == pytest.approx(0.03 * report.ac + 0.23 * report.mac)


def test_binary_inputs_count_as_spikes(x64):
    model, shape, _ = deploy_model("mlp")
    x = (jax.random.uniform(jax.random.key(6), shape) < 0.3).astype(jnp.float64)  # e.g. Poisson-encoded
    first = count_ops(model, x).layers[0]
    assert first.input == "spikes" and first.mac == 0
    assert first.ac == float(x.sum()) / shape[1] * 48 and first.spikes == float(x.sum()) / shape[1]


def test_cli_counts_a_config(tmp_path, capsys):
    out = tmp_path / "energy.json"
    assert energy.main(["--config", "configs/digits.py", "--config.data.time_steps=2", "--batch_size", "16",
                        "--batches", "2", "--out", str(out), "--e_mac", "3.0"]) == 0
    printed = capsys.readouterr().out
    assert "mlp at initialisation, digits test split" in printed and "MAC 3.0 pJ" in printed
    report = json.loads(out.read_text())
    assert report["examples"] == 32 and [r["name"] for r in report["layers"]] == ["fcs.0", "head"]
    assert report["layers"][0]["mac"] == 2 * 64 * 256  # T x in x out, the digits' real-valued pixels
    assert report["energy_pj"] == pytest.approx(0.9 * report["ac"] + 3.0 * report["mac"])
    assert energy.main(["--batches", "1"]) == 2


SJ_COUNT = """
import sys, json, numpy as np, torch
from spikingjelly.activation_based.op_counter import DispatchCounterMode, MACCounter, SynOpCounter
layers = json.loads(open(sys.argv[1]).read())
data = np.load(sys.argv[2])
out = {}
for name, geo in layers.items():
    x = torch.from_numpy(data[name])
    if geo["kind"] == "conv":
        m = torch.nn.Conv2d(x.shape[1], geo["out"], geo["k"], stride=geo["stride"], padding=geo["pad"]).double()
    else:
        m = torch.nn.Linear(x.shape[1], geo["out"]).double()
    syn, mac = SynOpCounter(), MACCounter()
    with torch.no_grad(), DispatchCounterMode([syn, mac]):
        m(x)
    out[name] = [syn.get_total(), mac.get_total()]
print(json.dumps(out))
"""


@pytest.mark.skipif(not os.environ.get("SNNJAX_SJ_PYTHON"), reason="no SpikingJelly interpreter (SNNJAX_SJ_PYTHON)")
def test_spikingjellys_op_counter_agrees_on_spike_inputs_and_counts_pooled_ones_dense(x64, tmp_path):
    """SpikingJelly's SynOps equal our AC where a layer reads spikes; a layer reading average-pooled spikes is
    not binary there, so SpikingJelly counts its dense MACs where we count the spikes' accumulates."""
    model, shape, scale = deploy_model("vgg")
    model.eval()
    x = scale * jax.random.uniform(jax.random.key(5), shape, jnp.float64)
    inputs, geometry = {}, {}
    for call in layer_chain(model, x)[1]:
        m, xin = call.module, call.x
        if isinstance(m, nnx.Conv):
            inputs[call.name] = np.asarray(xin).reshape(-1, *xin.shape[2:]).transpose(0, 3, 1, 2)
            geometry[call.name] = {"kind": "conv", "out": m.out_features, "k": m.kernel_size[0], "stride": 1,
                                   "pad": m.padding[0][0]}
        elif isinstance(m, nnx.Linear):
            inputs[call.name] = np.asarray(xin).reshape(-1, xin.shape[-1])
            geometry[call.name] = {"kind": "linear", "out": m.out_features}
    (tmp_path / "layers.json").write_text(json.dumps(geometry))
    np.savez(tmp_path / "inputs.npz", **inputs)
    result = subprocess.run([os.environ["SNNJAX_SJ_PYTHON"], "-c", SJ_COUNT, str(tmp_path / "layers.json"),
                             str(tmp_path / "inputs.npz")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    sj = json.loads(result.stdout.strip().splitlines()[-1])
    n = shape[1]
    for r in count_ops(model, x).layers:
        synops, macs = (v / n for v in sj[r.name])
        if r.input == "spikes":
            assert (synops, macs) == (r.ac, 0), r.name
        else:  # real input, or pooled spikes (not binary): SpikingJelly's dense MAC count is our dense count
            assert (synops, macs) == (0, r.dense_ops), r.name
