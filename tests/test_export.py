"""The exported model (jax.export, symbolic batch) runs in a fresh process from the file alone and reproduces logits."""
import hashlib
import io
import json
import re
import subprocess
import sys
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import ROOT, load_config, randomize_batch_norm

from snnjax import Sequential, layers
from snnjax.deploy import export as export_lib
from snnjax.deploy.exported import ExportedFileError, load_exported
from snnjax.deploy.run import load_run
from snnjax.models import CIFAR10DVSVGG
from snnjax.neurons import LIFNode
from snnjax.train import train_and_evaluate

LOADER = ROOT / "snnjax" / "deploy" / "exported.py"

# Run in a fresh interpreter: the reader's file imported on its own (no snnjax package, no model code).
FRESH = """
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("loader", sys.argv[1])
loader = importlib.util.module_from_spec(spec)
sys.modules["loader"] = loader
spec.loader.exec_module(loader)
model = loader.load_exported(sys.argv[2])
inputs = np.load(sys.argv[3])
out = {}
for name in inputs.files:
    x = inputs[name]
    out[name] = np.asarray(model(x))
    states = model.init_states(x.shape[1])
    steps = []
    for t in range(x.shape[0]):
        logits, states = model.step(x[t], states)
        steps.append(np.asarray(logits))
    out[name + "_steps"] = np.stack(steps)
np.savez(sys.argv[4], **out)
print(sorted(m for m in sys.modules if m.startswith("snnjax")))
"""


def run_fresh(model_file, inputs: dict, tmp_path) -> dict:
    np.savez(tmp_path / "inputs.npz", **inputs)
    result = subprocess.run([sys.executable, "-c", FRESH, str(LOADER), str(model_file), str(tmp_path / "inputs.npz"),
                             str(tmp_path / "out.npz")], capture_output=True, text=True, timeout=300,
                            env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"  # nothing of snnjax was imported
    return dict(np.load(tmp_path / "out.npz"))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("digits")
    train_and_evaluate(load_config("digits", num_steps=6, log_every_steps=6, checkpoint_every_steps=6), workdir)
    return workdir


def test_exported_run_reproduces_the_models_logits_in_a_fresh_process(run, tmp_path, capsys):
    out = tmp_path / "model.bin"
    assert export_lib.main(["--workdir", str(run), "--out", str(out)]) == 0
    assert "multi-step and single-step, input [T=4, b, 8, 8, 1] float32" in capsys.readouterr().out
    meta = json.loads(zipfile.ZipFile(out).read("meta.json"))
    assert meta["step"] == 6 and meta["states"] == [{"shape": [256], "dtype": "float32", "init": 0.0}]
    rng = np.random.default_rng(0)
    inputs = {f"n{n}": rng.uniform(0, 2, (4, n, 8, 8, 1)).astype(np.float32) for n in (3, 16)}
    got = run_fresh(out, inputs, tmp_path)
    model = load_run(run).model
    for name, x in inputs.items():
        want = jax.jit(lambda m, x: m(x))(model, jnp.asarray(x))
        assert float(jnp.abs(want).max()) > 0.2
        np.testing.assert_allclose(got[name], want, rtol=0, atol=1e-6)
        np.testing.assert_allclose(got[name + "_steps"], want, rtol=0, atol=1e-6)


def test_exported_conv_net_at_two_batch_sizes(tmp_path):
    model = CIFAR10DVSVGG(widths=(8, 16), pools=(False, True), image_size=16, num_classes=4, rngs=nnx.Rngs(0))
    randomize_batch_norm(model)
    model.eval()
    out = tmp_path / "vgg.bin"
    meta = export_lib.export_model(model, (16, 16, 2), 3, jnp.float32, str(out), platforms=["cpu"])
    assert [s["shape"] for s in meta["states"]] == [[16, 16, 8], [8, 8, 16]]
    rng = np.random.default_rng(1)
    inputs = {f"n{n}": rng.uniform(0, 3, (3, n, 16, 16, 2)).astype(np.float32) for n in (2, 5)}
    loaded = load_exported(out)  # in this process too: the same loader
    for x in inputs.values():
        want = jax.jit(lambda m, x: m(x))(model, jnp.asarray(x))
        assert float(jnp.abs(want).max()) > 0.1
        np.testing.assert_allclose(loaded(x), want, rtol=0, atol=1e-6)
        np.testing.assert_allclose(loaded.step(x[0], loaded.init_states(x.shape[1]))[0], want[0], rtol=0, atol=1e-6)


def test_a_model_streaming_refuses_exports_without_a_single_step(x64, tmp_path):
    """A neuron called twice per step has no single state to carry: multi-step only, the reason in the file."""
    rngs, lif = nnx.Rngs(0), LIFNode(step_mode="m")
    model = Sequential(layers.linear(3, 3, rngs=rngs), lif, layers.linear(3, 2, rngs=rngs), lif)
    meta = export_lib.export_model(model, (3,), 2, jnp.float32, str(tmp_path / "m.bin"), platforms=["cpu"])
    assert meta["states"] == [] and "called 2 times per time step" in meta["single_step_note"]
    with pytest.raises(ValueError, match="no single-step variant: Sequential's neuron layers.1 is called 2 times"):
        load_exported(tmp_path / "m.bin").init_states(1)


def test_loader_refuses_other_files(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"not a zip")
    with pytest.raises(ExportedFileError, match="x.bin: unreadable zip archive .*not an intact model written by "
                                                "python -m snnjax.export"):
        load_exported(tmp_path / "x.bin")


@pytest.fixture(scope="module")
def small_file(tmp_path_factory) -> bytes:
    """A valid export of a tiny MLP with a single step, as bytes."""
    rngs = nnx.Rngs(0)
    model = Sequential(layers.linear(3, 4, rngs=rngs), LIFNode(step_mode="m"), layers.linear(4, 2, rngs=rngs))
    out = tmp_path_factory.mktemp("export") / "m.bin"
    export_lib.export_model(model, (3,), 2, jnp.float32, str(out), platforms=["cpu"])
    return out.read_bytes()


def rewrite(content: bytes, compression=zipfile.ZIP_STORED, fix_digests=True, **members) -> bytes:
    """``content`` (an export) with ``members`` replaced (None: removed); meta.json's digests follow unless not
    ``fix_digests``."""
    with zipfile.ZipFile(io.BytesIO(content)) as z:
        files = {name: z.read(name) for name in z.namelist()}
    files.update(members)
    files = {k: v for k, v in files.items() if v is not None}
    if fix_digests and "meta.json" not in members:
        meta = json.loads(files["meta.json"])
        meta["sha256"] = {k: hashlib.sha256(v).hexdigest() for k, v in files.items() if k != "meta.json"}
        files["meta.json"] = json.dumps(meta).encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buffer.getvalue()


def npz(*arrays, header_shape=None) -> bytes:
    """An npz of ``arrays`` (``p0``, ``p1``, ...); ``header_shape``: what the first array's header claims."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for i, a in enumerate(arrays):
            npy = io.BytesIO()
            header = {"descr": np.lib.format.dtype_to_descr(a.dtype), "fortran_order": False,
                      "shape": header_shape if i == 0 and header_shape else a.shape}
            np.lib.format.write_array_header_1_0(npy, header)
            z.writestr(f"p{i}.npy", npy.getvalue() + (a.tobytes() if a.dtype != object else b"\x80\x04."))
    return buffer.getvalue()


def meta_of(content: bytes, **changes) -> bytes:
    meta = json.loads(zipfile.ZipFile(io.BytesIO(content)).read("meta.json"))
    return json.dumps({**meta, **changes}).encode()


BAD_EXPORTS = {  # name: (damage, what the error says)
    "a member inflating to 64 MiB": (lambda b: rewrite(b, zipfile.ZIP_DEFLATED, **{"multi_step.jax": bytes(1 << 26)}),
                                     "member meta.json is compressed"),
    "a member's bytes changed": (lambda b: rewrite(b, fix_digests=False, **{"multi_step.jax": b"\0" * 100}),
                                 "multi_step.jax's SHA-256 differs"),
    "meta.json not JSON": (lambda b: rewrite(b, **{"meta.json": b"{nope"}), "meta.json is not JSON"),
    "meta.json of 2 MiB": (lambda b: rewrite(b, **{"meta.json": b" " * (2 << 20)}), "meta.json is 2097152 bytes"),
    "meta.json a list": (lambda b: rewrite(b, **{"meta.json": b"[1]"}), "meta.json is not a JSON object"),
    "the first format": (lambda b: rewrite(b, **{"meta.json": meta_of(b, format="snnjax-export-1")}),
                         "written before checksums were kept"),
    "bad fields": (lambda b: rewrite(b, **{"meta.json": meta_of(b, frame_shape=[0], dtype="object")}),
                   "frame_shape is not a list of positive ints; dtype 'object'"),
    "no params": (lambda b: rewrite(b, **{"params.npz": None}), "no params.npz in the archive"),
    "an extra member": (lambda b: rewrite(b, **{"x.py": b"print(1)"}), "unexpected or repeated member 'x.py'"),
    "NaN parameters": (lambda b: rewrite(b, **{"params.npz": npz(np.full((3, 4), np.nan, np.float32))}),
                       "params.npz: p0.npy holds 12 NaN or infinite values"),
    "an array header claiming 2^40 elements": (
        lambda b: rewrite(b, **{"params.npz": npz(np.zeros(4, np.float32), header_shape=(1 << 40,))}),
        "header claims (1099511627776,) float32"),
    "pickled parameters": (lambda b: rewrite(b, **{"params.npz": npz(np.array([{}], object))}), "holds Python objects"),
    "not a serialisation": (lambda b: rewrite(b, **{"multi_step.jax": b"\x00" * 64}),
                            "multi_step.jax is not a jax.export serialisation"),
    "truncated": (lambda b: b[:len(b) // 2], "unreadable zip archive"),
    "empty": (lambda b: b"", "unreadable zip archive"),
}


@pytest.mark.parametrize("case", BAD_EXPORTS)
def test_damaged_exports_are_refused_before_deserialising(small_file, tmp_path, case):
    damage, reason = BAD_EXPORTS[case]
    path = tmp_path / "m.bin"
    path.write_bytes(damage(small_file))
    with pytest.raises(ExportedFileError, match=re.escape(f"{path}: ") + ".*" + re.escape(reason)):
        load_exported(path)


def test_the_small_export_loads(small_file, tmp_path):
    (tmp_path / "m.bin").write_bytes(small_file)
    model = load_exported(tmp_path / "m.bin")
    assert model(np.ones((2, 5, 3), np.float32)).shape == (2, 5, 2)
