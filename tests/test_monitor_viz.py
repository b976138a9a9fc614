"""``snnjax.monitor`` (per-neuron spikes, firing rates, membrane potentials from one forward pass, the model
unchanged), the sharding descriptions (any rank, pipeline rows by name) and ``snnjax.viz``'s plots."""
from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import snnjax
from snnjax import layers, monitor, parallel
from snnjax.neurons import IFNode, LIFNode


def net():
    rngs = nnx.Rngs(0)
    return snnjax.Sequential(
        layers.conv2d(2, 8, 3, padding=1, rngs=rngs, axes=("embed", "mlp")), layers.BatchNorm(8, axes=("mlp",)),
        LIFNode(tau=2.0, step_mode="m"), layers.Flatten(),
        layers.linear(8 * 16, 16, rngs=rngs, axes=("mlp", "embed")), IFNode(step_mode="m"),
        layers.linear(16, 10, rngs=rngs, axes=("embed", "classes")))


X = jnp.asarray(np.random.default_rng(0).uniform(0, 3, (3, 8, 4, 4, 2)), jnp.float32)


def test_monitor_reports_every_neuron_without_changing_the_model():
    model = net()
    before = np.asarray(model.layers[1].mean.get_value())
    rec = monitor.record(model, X, train=True)
    assert set(rec) == {"layers.2", "layers.5"}
    np.testing.assert_array_equal(np.asarray(model.layers[1].mean.get_value()), before)  # a copy ran
    model.eval()
    h = model.layers[1](model.layers[0](X))
    spikes, v = model.layers[2].multi_step(h, return_v_seq=True)
    rec = monitor.record(model, X)
    np.testing.assert_array_equal(np.asarray(rec["layers.2"]["spikes"]), np.asarray(spikes))
    np.testing.assert_allclose(np.asarray(rec["layers.2"]["v"]), np.asarray(v), rtol=1e-6)
    rates, counts = monitor.firing_rates(model, X), monitor.spike_counts(model, X)
    assert rates["layers.2"] == pytest.approx(float(spikes.mean()))
    assert counts["layers.2"] == int(spikes.sum()) and 0 < rates["layers.2"] < 1 and counts["layers.5"] >= 0
    with pytest.raises(ValueError, match="no spiking neuron"):
        monitor.firing_rates(snnjax.Sequential(layers.Flatten()), X)


def test_shard_blocks_of_a_conv_kernel_and_pipeline_rows():
    tr = snnjax.trainer(net(), "fsdp=4,tensor=2", verbose=False)
    kernel = tr.state.params["layers"][0]["kernel"].get_value()  # [3, 3, 2, 8]: out channels over tensor x fsdp
    dims, blocks = parallel.shard_blocks(kernel)
    assert dims == (2, 3) and len(blocks) == 8
    assert sorted(d for b in blocks for d in b["devices"]) == list(range(8))
    assert {b["cols"] for b in blocks} == {(i, i + 1) for i in range(8)} and {b["rows"] for b in blocks} == {(0, 2)}
    tr = snnjax.trainer(net(), "stage=2,data=4", pipeline=parallel.PipelineOptions(microbatches=2), verbose=False)
    rows = parallel.stage_rows(tr.plan.packing)
    assert sorted(r["path"] for r in rows) == sorted(p.path for p in tr.plan.params)
    assert {r["device"] for r in rows} == {0, 1}
    text = parallel.describe_stage_rows(tr.plan.packing)
    assert "device 0:" in text and "layers.0.kernel" in text and "(3, 3, 2, 8)" in text


def test_viz_draws(monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setitem(os.environ, "MPLBACKEND", "Agg")
    from snnjax import viz  # noqa: PLC0415 (matplotlib is optional)

    rec = monitor.record(net(), X)
    ax = viz.raster(rec["layers.2"]["spikes"])
    assert len(ax.collections[0].get_offsets()) == int(np.asarray(rec["layers.2"]["spikes"][:, 0]).sum())
    ax = viz.membrane(rec["layers.2"]["v"], rec["layers.2"]["spikes"], threshold=1.0, neurons=(0, 1))
    assert len(ax.lines) == 3  # two traces and the threshold
    assert len(viz.firing_rates(monitor.firing_rates(net(), X)).patches) == 2
    tr = snnjax.trainer(net(), "fsdp=4,tensor=2", verbose=False)
    assert len(viz.sharding(tr.state.params["layers"][0]["kernel"].get_value()).patches) == 8
    with pytest.raises(ValueError, match="no pipeline rows"):
        viz.stage_rows(tr.plan)
