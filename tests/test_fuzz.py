"""Every reader of outside files, fuzzed: a valid file cut, bit-flipped, overwritten or replaced must either read
or raise the reader's documented error naming the file, never another exception, a hang or a crash.

Each reader gets ``SNNJAX_FUZZ_EXAMPLES`` examples (default 100; the graph-value test, which builds models, a
third of that, the NIR file a tenth, the SHD files half), drawn the same way on every run (conftest's
hypothesis profile); longer runs by hand:
``SNNJAX_FUZZ_EXAMPLES=1000 SNNJAX_HYPOTHESIS_RANDOM=1 pytest -n 0 tests/test_fuzz.py``.
libhdf5 (native code under h5py) can spin for minutes on some damaged HDF5 files (a corrupt global heap):
``from_nir`` and the SHD/SSC reader read a file in a child process with a time limit first
(:mod:`snnjax.runtime.trial_read`).
"""
import copy
import io
import json
import os
import pathlib
import tempfile
import zipfile

import nir
import numpy as np
import pytest
from flax import nnx
from helpers import (
    AEDAT31_HEADER,
    aedat31_event_word,
    aedat31_packet,
    aedat_bytes,
    nmnist_bytes,
    ragged,
    random_aedat,
    random_events,
    write_shd_h5,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from snnjax import layers
from snnjax.data.cifar10dvs import read_cifar10dvs_aedat
from snnjax.data.dvs128_gesture import read_aedat31, read_labels_csv
from snnjax.data.frames import FrameSpec
from snnjax.data.image_folder import load_image
from snnjax.data.nmnist import read_nmnist_bin
from snnjax.data.shd import HeidelbergSource
from snnjax.deploy import export as export_lib
from snnjax.deploy.exported import ExportedFileError, load_exported
from snnjax.deploy.nir import NIRError, from_nir, to_nir
from snnjax.models import SpikingMLP
from snnjax.models.sequential import Sequential

EXAMPLES = int(os.environ.get("SNNJAX_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def damaged(draw, valid: bytes) -> bytes:
    """``valid`` cut, with bits flipped, a span overwritten (0x00, 0xFF, random), bytes inserted, or replaced."""
    n = len(valid)
    kind = draw(st.sampled_from(["cut", "flip", "span", "insert", "random", "count"]))
    data = bytearray(valid)
    if kind == "cut":
        return bytes(data[:draw(st.integers(0, max(n - 1, 0)))])
    if kind == "flip":
        for i in draw(st.lists(st.integers(0, n * 8 - 1), min_size=1, max_size=16)):
            data[i // 8] ^= 1 << (i % 8)
        return bytes(data)
    if kind == "span":
        start = draw(st.integers(0, n - 1))
        length = draw(st.integers(1, max(1, n - start)))
        fill = draw(st.sampled_from([b"\x00", b"\xff", None]))
        data[start:start + length] = fill * length if fill else draw(st.binary(min_size=length, max_size=length))
        return bytes(data)
    if kind == "insert":
        at = draw(st.integers(0, n))
        return bytes(data[:at] + draw(st.binary(min_size=1, max_size=64)) + data[at:])
    if kind == "count":  # a 4- or 8-byte little- or big-endian integer near 2^31 or 2^63 written anywhere
        width, order = draw(st.sampled_from([4, 8])), draw(st.sampled_from(["little", "big"]))
        value = draw(st.sampled_from([2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 1]))
        at = draw(st.integers(0, max(0, n - width)))
        data[at:at + width] = (value % (1 << (8 * width))).to_bytes(width, order)
        return bytes(data)
    return draw(st.binary(max_size=2 * n))


def check(path: pathlib.Path, content: bytes, read, error: type[Exception]):
    """``read(path)`` on ``content`` returns, or raises ``error`` naming ``path``."""
    path.write_bytes(content)
    try:
        return read(path)
    except error as e:
        assert str(path) in str(e), f"{type(e).__name__} without the file name: {e}"
        return None


def fuzz(valid: bytes, read, error: type[Exception] = ValueError, suffix: str = ".bin", examples: int = EXAMPLES):
    """A hypothesis test of ``read`` on damaged copies of ``valid`` in a fresh folder per example."""
    @settings(FUZZ, max_examples=examples)
    @given(content=damaged(valid))
    def run(content):
        with tempfile.TemporaryDirectory() as folder:
            check(pathlib.Path(folder) / f"file{suffix}", content, read, error)

    run()


def test_fuzz_aedat2():
    fuzz(aedat_bytes(*random_aedat(np.random.default_rng(0), 64)), read_cifar10dvs_aedat, suffix=".aedat")


def test_fuzz_aedat31():
    rng = np.random.default_rng(1)
    events = [(aedat31_event_word(int(x), int(y), int(p)), int(t)) for t, x, y, p in zip(
        np.sort(rng.integers(0, 10**6, 48)), rng.integers(0, 128, 48), rng.integers(0, 128, 48),
        rng.integers(0, 2, 48), strict=True)]
    valid = AEDAT31_HEADER + aedat31_packet(1, events[:24], 0) + aedat31_packet(2, [(5, 5)], 0) \
        + aedat31_packet(1, events[24:], 0)
    fuzz(valid, read_aedat31, suffix=".aedat")


def test_fuzz_atis_bin():
    fuzz(nmnist_bytes(*random_events(np.random.default_rng(2), 64, 34, 34)), read_nmnist_bin)


def test_fuzz_gesture_labels_csv():
    fuzz(b"class,startTime_usec,endTime_usec\n1,100,900\n11,1000,5000\n3,6000,9000\n", read_labels_csv,
         suffix=".csv")


def test_fuzz_images():
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(3).integers(0, 255, (12, 16, 3), np.uint8)).save(buffer, "JPEG")
    fuzz(buffer.getvalue(), lambda p: load_image(p, 8, np.random.default_rng(0), True), suffix=".JPEG")
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(3).integers(0, 255, (12, 16, 3), np.uint8)).save(buffer, "PNG")
    fuzz(buffer.getvalue(), lambda p: load_image(p, 8, None, False), suffix=".png")


@pytest.fixture(scope="module")
def exported_file(tmp_path_factory) -> bytes:
    rngs = nnx.Rngs(0)
    model = Sequential(layers.linear(3, 4, rngs=rngs), layers.linear(4, 2, rngs=rngs))
    out = tmp_path_factory.mktemp("fuzz") / "m.bin"
    export_lib.export_model(model, (3,), 2, np.float32, str(out), platforms=["cpu"])
    return out.read_bytes()


def test_fuzz_exported_model(exported_file):
    fuzz(exported_file, load_exported, ExportedFileError)


def test_fuzz_exported_model_members(exported_file):
    """Damage inside one member, the archive (and so its CRC) rebuilt: the checksums and parsers are reached."""
    with zipfile.ZipFile(io.BytesIO(exported_file)) as z:
        members = {name: z.read(name) for name in z.namelist()}

    @FUZZ
    @given(name=st.sampled_from(sorted(members)), data=st.data())
    def run(name, data):
        files = dict(members, **{name: data.draw(damaged(members[name]))})
        if name != "meta.json" and data.draw(st.booleans()):  # damage the checksum cannot see
            meta = json.loads(files["meta.json"])
            meta["sha256"][name] = __import__("hashlib").sha256(files[name]).hexdigest()
            files["meta.json"] = json.dumps(meta).encode()
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as z:
            for k, v in files.items():
                z.writestr(k, v)
        with tempfile.TemporaryDirectory() as folder:
            check(pathlib.Path(folder) / "m.bin", buffer.getvalue(), load_exported, ExportedFileError)

    run()


def test_fuzz_nir_graph_values():
    """Node parameters replaced by drawn arrays (shapes, NaN, infinities, zeros): NIRError or a model."""
    graph = to_nir(SpikingMLP(6, (4,), 2, rngs=nnx.Rngs(0)), (6,))
    fields = [(name, field) for name, node in graph.nodes.items() for field in vars(node)
              if isinstance(getattr(node, field), np.ndarray) and field not in ("input_type", "output_type")]
    values = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.integers(-3, 10**9))

    @settings(FUZZ, max_examples=max(EXAMPLES // 3, 1))
    @given(st.sampled_from(fields), st.lists(st.integers(0, 9), min_size=0, max_size=3), values)
    def run(where, shape, value):
        name, field = where
        g = copy.deepcopy(graph)
        setattr(g.nodes[name], field, np.full(shape, value))
        try:
            from_nir(g)
        except NIRError:
            pass

    run()


def test_fuzz_nir_file(tmp_path):
    """A tenth of the examples: each file that h5py opens is also read in a child process (from_nir's trial read)."""
    path = tmp_path / "m.nir"
    nir.write(path, to_nir(SpikingMLP(6, (4,), 2, rngs=nnx.Rngs(0)), (6,)))
    fuzz(path.read_bytes(), from_nir, NIRError, suffix=".nir", examples=max(EXAMPLES // 10, 1))


def test_fuzz_shd_file_bytes(tmp_path):
    """Damaged bytes of an SHD file: its first read (checks and spike copy) runs in the child process, cut at
    read_timeout (libhdf5 spins for minutes on some damaged heaps: tests/test_data_shd.py has one); frames or a
    ValueError naming the file."""
    rng = np.random.default_rng(3)
    path = tmp_path / "shd_train.h5"
    write_shd_h5(path, [(np.sort(rng.uniform(0, 1, 6)).astype(np.float16), rng.integers(0, 700, 6).astype(np.uint16))
                        for _ in range(3)], [0, 5, 19])

    def read(file):
        source = HeidelbergSource(file, 20, FrameSpec(time_steps=2), cache_dir=file.parent, read_timeout=2)
        assert np.isfinite(source.read(np.arange(len(source)))[0]).all()

    fuzz(path.read_bytes(), read, suffix=".h5", examples=max(EXAMPLES // 2, 1))


def test_fuzz_shd_file_contents(tmp_path):
    """Drawn datasets (dtypes, fixed or variable length, NaN, infinite, negative or huge values, labels): a
    ValueError naming the file or frames."""
    import h5py  # noqa: PLC0415

    numbers = st.sampled_from([0.0, 0.5, 1.0, -1.0, np.nan, np.inf, 1e30, 699, 700, 2**31, -(2**31)])
    dtypes = st.sampled_from([np.float16, np.float32, np.float64, np.int32, np.uint16, np.int64])

    @settings(FUZZ, max_examples=max(EXAMPLES // 2, 1))
    @given(n=st.integers(0, 3), length=st.integers(0, 5), times=numbers, units=numbers, label=numbers,
           dtype_t=dtypes, dtype_u=dtypes, dtype_l=dtypes, fixed=st.booleans())
    def run(n, length, times, units, label, dtype_t, dtype_u, dtype_l, fixed):
        with tempfile.TemporaryDirectory() as folder:
            path = pathlib.Path(folder) / "shd_train.h5"
            with np.errstate(invalid="ignore", over="ignore"), h5py.File(path, "w") as f:
                for name, value, dtype in (("spikes/times", times, dtype_t), ("spikes/units", units, dtype_u)):
                    rows = [np.sort(np.full(length, value).astype(dtype)) for _ in range(n)]
                    if fixed:
                        f.create_dataset(name, data=np.zeros((n, length), dtype) if not rows else np.stack(rows))
                    else:
                        f.create_dataset(name, data=ragged(rows), dtype=h5py.vlen_dtype(dtype))
                f.create_dataset("labels", data=np.full(n, label).astype(dtype_l))
            try:
                source = HeidelbergSource(path, 20, FrameSpec(time_steps=2), cache=False)
                frames, _ = source.read(np.arange(len(source)))
                assert np.isfinite(frames).all()
            except ValueError as e:
                assert str(path) in str(e), e

    run()
