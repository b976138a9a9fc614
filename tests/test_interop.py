"""SpikingJelly interop: the reference-file checker and its command line (any file in the format), and weight import.

- ``python -m snnjax.interop check`` passes every shipped neuron case, reads any file in the
  format, reports a flipped spike (its ``main`` called in this process) and missing files (a
  subprocess: the module's exit code).
- Both shipped model cases (VGG, Spikformer) with their neurons on ``xla`` (the path of every
  multi-device layout) and ``native`` (``auto`` on one CPU device): eval / train logits, loss,
  every parameter gradient and the BatchNorm statistics after the step.
- Weight import converts layouts and names what is wrong.
"""
from __future__ import annotations

import contextlib
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import quick_compiles
from flax import nnx

from snnjax.interop import check, rules
from snnjax.interop.__main__ import main as interop_main
from snnjax.interop.spikingjelly import import_state_dict
from snnjax.models import CIFAR10DVSVGG, Spikformer, registry
from snnjax.neurons.compare import REFERENCE, run_vjp

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "spikingjelly" / "models.npz"


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def run_check(path) -> tuple[int, list[dict]]:
    """``python -m snnjax.interop check PATH`` in a subprocess: its exit code and JSON lines."""
    proc = subprocess.run([sys.executable, "-m", "snnjax.interop", "check", str(path)],
                          capture_output=True, text=True, timeout=900)
    return proc.returncode, _json_lines(proc.stdout)


def check_here(path, capsys) -> tuple[int, list[dict]]:
    """The same command line's ``main`` in this process; the x64 and PRNG settings it makes are restored after."""
    saved = {name: getattr(jax.config, name) for name in ("jax_enable_x64", "jax_default_prng_impl")}
    try:
        code = interop_main(["check", str(path)])
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)
    return code, _json_lines(capsys.readouterr().out)


def test_cli_passes_every_shipped_neuron_case(reference_dir, capsys):
    code, lines = check_here(reference_dir / "neurons.npz", capsys)
    assert lines[-1] == {"cases": 69, "failed": 0}, lines[-1]
    assert code == 0
    assert all(line["ok"] and line["spike_mismatches"] == 0 for line in lines[:-1])


@pytest.mark.parametrize("impl", ["xla", "native"])
@pytest.mark.parametrize("name", ["vgg", "spikformer"])
def test_models_match_spikingjelly(name, impl, x64):
    """Eval/train logits, loss, every parameter gradient, BN statistics after the step. Spikformer's programs
    compile with ``conftest.quick_compiles`` (VGG's convolutions run longer unoptimised than they compile)."""
    cases, arrays = check.load(FIXTURE)
    assert set(cases) == {"vgg", "spikformer"}
    with quick_compiles() if name == "spikformer" else contextlib.nullcontext():
        r = check.check_model_case(cases[name], check.case_arrays(arrays, f"{name}/"), impl)
    assert r["ok"], r
    assert r["grads_missing"] == 0 and r["grads_checked"] > 30
    assert r["bn_state_max"] < 1e-12 and r["logits_train"] < 1e-12


def _write_neuron_file(path: pathlib.Path, cases, rng, T=3, shape=(2, 5, 4)):
    """A reference file in the shipped format, other shapes/surrogates, values from the autodiff reference."""
    arrays = {}
    for i, case in enumerate(cases):
        cfg = check.neuron_config(case)
        x = rng.normal(0.4, 1.2, (T,) + shape)
        gy = rng.normal(size=(T,) + shape)
        w = check.plif_w(case, {}) if cfg.kind == "PLIF" else None  # SpikingJelly's initial w
        (s, v), (gx, _, gw) = run_vjp(REFERENCE, cfg, True, x, None, w, gy, np.zeros_like(x))
        p = f"case{i:03d}/"
        arrays.update({p + "x": x, p + "grad_spikes": gy, p + "spikes": np.asarray(s), p + "v_seq": np.asarray(v),
                       p + "grad_x": np.asarray(gx)})
        if w is not None:
            arrays.update({p + "w": w, p + "grad_w": np.asarray(gw)})
    np.savez(path, **arrays)
    path.with_suffix(".json").write_text(json.dumps(cases))
    return arrays


def test_checker_reads_any_file_in_the_format_and_detects_a_flipped_spike(tmp_path, x64, capsys):
    cases = [
        dict(kind="IF", v_threshold=0.7, v_reset=None, detach_reset=False, surrogate="piecewise_quadratic1"),
        dict(kind="LIF", tau=3.0, decay_input=False, v_threshold=1.0, v_reset=-0.2, detach_reset=False,
             surrogate="soft_sign2"),
        dict(kind="PLIF", init_tau=1.5, decay_input=True, v_threshold=1.0, v_reset=0.0, detach_reset=True,
             surrogate="sigmoid4"),
    ]
    path = tmp_path / "mine.npz"
    arrays = _write_neuron_file(path, cases, np.random.default_rng(0))
    code, lines = check_here(path, capsys)
    assert code == 0 and lines[-1] == {"cases": 3, "failed": 0}, lines

    flip = np.array(arrays["case001/spikes"])
    flip.flat[np.argmax(flip.ravel() == 0)] = 1.0
    np.savez(path, **{**arrays, "case001/spikes": flip})
    code, lines = check_here(path, capsys)
    assert code == 1 and lines[-1] == {"cases": 3, "failed": 1}
    assert lines[1]["spike_mismatches"] == 1 and not lines[1]["ok"]


def test_checker_reports_missing_files(tmp_path):
    code, lines = run_check(tmp_path / "absent.npz")
    assert code == 2 and "not found" in lines[0]["error"]


def _init_state_dict(model: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURE) as arrays:
        return check.case_arrays(arrays, f"{model}/init/")


def _small_vgg(widths=(8, 16, 32, 32, 64, 64, 64, 64)):
    """The fixture's VGG, its variables abstract (the import gives them values)."""
    return nnx.eval_shape(lambda: CIFAR10DVSVGG(widths=list(widths), dropout=0.0, rngs=nnx.Rngs(0)))


def test_import_converts_layouts():
    sd = _init_state_dict("vgg")
    model = _small_vgg()
    import_state_dict(model, sd)
    np.testing.assert_allclose(model.features[0].conv.kernel[...],
                               sd["features.0.proj_bn.0.weight"].transpose(2, 3, 1, 0), rtol=1e-6)
    assert model.features[2].conv.kernel[...].shape == (3, 3, 16, 32)  # pooled block: conv is proj_bn.1
    assert model.features[0].conv.kernel[...].dtype == jnp.float32  # cast to the model's dtype
    # classifier: torch flattens [C, H, W]; ours is [H, W, C]
    w = sd["classifier.0.weight"].reshape(10, 64, 3, 3)
    np.testing.assert_allclose(model.classifier.kernel[...][(1 * 3 + 2) * 64 + 5], w[:, 5, 1, 2], rtol=1e-6)


def test_import_errors_name_the_problem():
    sd = _init_state_dict("vgg")
    with pytest.raises(KeyError, match="no counterpart"):
        import_state_dict(_small_vgg(), {**sd, "features.9.proj_bn.0.weight": np.zeros((1,))})
    with pytest.raises(KeyError, match="does not provide"):
        import_state_dict(_small_vgg(), {k: v for k, v in sd.items() if "features.3" not in k})
    with pytest.raises(ValueError, match="shape mismatch"):
        import_state_dict(_small_vgg((8, 16, 32, 32, 64, 64, 64, 128)), sd)
    with pytest.raises(KeyError, match="no counterpart in Linear"):  # not a zoo model: located layer by layer
        import_state_dict(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), sd)


def test_a_family_registers_its_table_in_its_model_file():
    """A table registered for a class (as each model file does) locates its keys, its subclasses' too; a second
    table for the class and an unknown kind are refused; every kind a Rule may name has a converter."""
    assert set(rules.KINDS) == set(registry.RULE_KINDS)
    with pytest.raises(ValueError, match="Rule kind must be one of"):
        registry.Rule("fc", "fc", "dense")

    class Head(nnx.Module):
        def __init__(self):
            self.fc = nnx.Linear(2, 3, rngs=nnx.Rngs(0))

    class WideHead(Head):
        pass

    registry.register_rules(Head, [registry.Rule(r"classifier\.1", "fc", "linear")])
    try:
        with pytest.raises(ValueError, match="already has an import table"):
            registry.register_rules(Head, [])
        weight = np.arange(6.0, dtype=np.float32).reshape(3, 2)
        model = WideHead()
        report = import_state_dict(model, {"classifier.1.weight": weight, "classifier.1.bias": np.zeros(3, np.float32)})
        assert [i.path for i in report.imported] == ["fc.kernel", "fc.bias"]
        np.testing.assert_array_equal(model.fc.kernel[...], weight.T)
    finally:
        del registry.IMPORT_TABLES[Head]


def test_spikformer_import_covers_every_variable():
    sd = _init_state_dict("spikformer")
    model = nnx.eval_shape(lambda: Spikformer(T=3, img_size_h=32,
                                              img_size_w=32, num_classes=10, embed_dims=32, num_heads=4, depths=2,
                                              rngs=nnx.Rngs(0)))
    import_state_dict(model, sd)
    np.testing.assert_allclose(model.blocks[1].attn.qkv.fc.kernel[...],  # [D, 3D] split as [D, 3, heads, head_dim]
                               sd["blocks.1.attn.qkv_conv_bn.0.weight"][:, :, 0].T.reshape(32, 3, 4, 8), rtol=1e-6)
