"""Load and run a model exported by ``python -m snnjax.export`` without the model's code (only jax and numpy).

    model = load_exported("model.bin")
    logits = model(x)                       # x [T, N, ...] -> [T, N, K], any N
    states = model.init_states(n)           # streaming: one time step at a time
    logits_t, states = model.step(x[t], states)

The file is a zip archive:

- ``meta.json``: format version, input shape per example and time step, ``time_steps``, dtype,
  the neuron states of the single step (shape without the batch, initial value), the run it came from;
- ``multi_step.jax``: ``jax.export`` serialisation (StableHLO) of ``(params, x [T, b, ...]) -> logits [T, b, K]``;
- ``single_step.jax``: of ``(params, states, x [b, ...]) -> (logits [b, K], states)`` (absent, with the reason
  in ``meta.json``'s ``single_step_note``, for a model that cannot run one time step at a time);
- ``params.npz``: the parameters and BatchNorm statistics, the functions' first argument (a list, in order).

The batch size ``b`` is symbolic: one file serves every batch size. Every member is stored uncompressed and
``meta.json``'s ``sha256`` holds the SHA-256 of the other three.

Reading an untrusted file: the reader checks, in this order, before anything is deserialised: a zip whose members
are the four above, stored (so no member is larger than the file: no decompression bomb), ``meta.json`` under
:data:`MAX_META_BYTES` with this format version and well-formed fields, each member's checksum, and
``params.npz`` parsed by its headers (no pickle, each array's size matching its bytes, every float finite). Only
then does ``jax.export.deserialize`` (native code) see the StableHLO. The checksum catches damage, not an
attacker who rewrites ``meta.json`` too: the StableHLO is a program, so run files from sources you trust as you
would their code. Every malformed file raises :class:`ExportedFileError` naming the file and what is wrong.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import pathlib
import struct
import zipfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

FORMAT = "snnjax-export-2"
MEMBERS = ("meta.json", "multi_step.jax", "single_step.jax", "params.npz")
MAX_META_BYTES = 1 << 20


class ExportedFileError(ValueError):
    """The file is not one ``python -m snnjax.export`` wrote, or it is damaged; the message names it and the fault."""


def sha256(data: bytes) -> str:
    """The hex SHA-256 of ``data`` (``meta.json``'s ``sha256`` values)."""
    return hashlib.sha256(data).hexdigest()


@dataclasses.dataclass
class ExportedModel:
    """An exported model: ``__call__`` runs the multi-step forward, ``step`` one time step (see the module docstring).

    Attributes:
      meta: ``meta.json``. params: the parameter arrays passed to the functions.
    """

    meta: dict[str, Any]
    params: list[jax.Array]
    multi_step: jax.export.Exported
    single_step: jax.export.Exported | None

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [T, N, ...]`` -> logits ``[T, N, K]``."""
        return self.multi_step.call(self.params, jnp.asarray(x, self.meta["dtype"]))

    def init_states(self, batch_size: int) -> list[jax.Array]:
        """Fresh neuron states for ``batch_size`` streams."""
        self._need_step()
        return [jnp.full((batch_size, *s["shape"]), s["init"], s["dtype"]) for s in self.meta["states"]]

    def step(self, x: jax.Array, states: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
        """One time step ``x [N, ...]`` from ``states``: ``(logits [N, K], new states)``."""
        self._need_step()
        logits, states = self.single_step.call(self.params, states, jnp.asarray(x, self.meta["dtype"]))
        return logits, list(states)

    def _need_step(self) -> None:
        if self.single_step is None:
            raise ValueError(f"this file has no single-step variant: {self.meta.get('single_step_note')}")


def load_exported(path: str | pathlib.Path) -> ExportedModel:
    """Read a file written by ``snnjax.export`` (checked before it is deserialised: see the module docstring).

    Raises:
      ExportedFileError: not such a file, another format version, or a damaged one (naming ``path`` and the fault).
      ValueError: a float64 file while ``jax_enable_x64`` is off.
    """
    def bad(what: str) -> ExportedFileError:
        return ExportedFileError(f"{path}: {what}; not an intact model written by python -m snnjax.export")

    try:
        with zipfile.ZipFile(path) as z:
            infos = _stored_members(z, bad)
            if infos["meta.json"].file_size > MAX_META_BYTES:
                raise bad(f"meta.json is {infos['meta.json'].file_size} bytes (at most {MAX_META_BYTES})")
            meta = _check_meta(z.read("meta.json"), "single_step.jax" in infos, bad)
            data = {name: z.read(name) for name in infos if name != "meta.json"}
    except ExportedFileError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, struct.error) as e:
        raise bad(f"unreadable zip archive ({type(e).__name__}: {e})") from None
    for name, blob in data.items():
        if sha256(blob) != meta["sha256"].get(name):
            raise bad(f"{name}'s SHA-256 differs from meta.json's: the file is damaged")
    params = [jnp.asarray(a) for a in _read_npz(data["params.npz"], bad)]
    if meta["dtype"] == "float64" and not jax.config.jax_enable_x64:
        raise ValueError(f"{path} was exported in float64: call jax.config.update('jax_enable_x64', True) first")
    exported = {}
    for name in ("multi_step.jax", "single_step.jax"):
        if name in data:
            try:
                exported[name] = jax.export.deserialize(bytearray(data[name]))
            except Exception as e:  # noqa: BLE001 (the deserializer raises many types for bytes it cannot parse)
                raise bad(f"{name} is not a jax.export serialisation ({type(e).__name__}: {e})") from None
    return ExportedModel(meta, params, exported["multi_step.jax"], exported.get("single_step.jax"))


def _stored_members(z: zipfile.ZipFile, bad) -> dict[str, zipfile.ZipInfo]:
    infos = {}
    for info in z.infolist():
        if info.filename not in MEMBERS or info.filename in infos:
            raise bad(f"unexpected or repeated member {info.filename[:80]!r} (members are {', '.join(MEMBERS)})")
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
            raise bad(f"member {info.filename} is compressed ({info.compress_size} bytes claiming "
                      f"{info.file_size}); the format stores members uncompressed")
        infos[info.filename] = info
    missing = [m for m in MEMBERS if m not in infos and m != "single_step.jax"]
    if missing:
        raise bad(f"no {', '.join(missing)} in the archive")
    return infos


def _check_meta(raw: bytes, has_single: bool, bad) -> dict[str, Any]:
    try:
        meta = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"meta.json is not JSON ({e})") from None
    if not isinstance(meta, dict):
        raise bad("meta.json is not a JSON object")
    if meta.get("format") != FORMAT:
        older = " (written before checksums were kept: export the run again)" if meta.get("format") == \
            "snnjax-export-1" else ""
        raise bad(f"format {str(meta.get('format'))[:40]!r}{older}; this loader reads {FORMAT!r}")

    def dims(v) -> bool:
        return isinstance(v, list) and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in v)

    problems = []
    if not dims(meta.get("frame_shape")):
        problems.append("frame_shape is not a list of positive ints")
    if not (isinstance(meta.get("time_steps"), int) and meta["time_steps"] > 0):
        problems.append("time_steps is not a positive int")
    if not _is_dtype(meta.get("dtype")):
        problems.append(f"dtype {str(meta.get('dtype'))[:40]!r} is not a numpy dtype name")
    states = meta.get("states")
    if not isinstance(states, list) or not all(
            isinstance(s, dict) and dims(s.get("shape")) and _is_dtype(s.get("dtype"))
            and isinstance(s.get("init"), (int, float)) for s in states):
        problems.append("states is not a list of {shape, dtype, init}")
    elif bool(states) != has_single:
        problems.append(f"states lists {len(states)} states but single_step.jax is "
                        f"{'present' if has_single else 'absent'}")
    digests = meta.get("sha256")
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        problems.append("sha256 is not an object of hex digests")
    if problems:
        raise bad("meta.json: " + "; ".join(problems))
    return meta


def _is_dtype(name) -> bool:
    if not isinstance(name, str):
        return False
    try:
        return not np.dtype(name).hasobject
    except TypeError:
        return False


def _read_npz(blob: bytes, bad) -> list[np.ndarray]:
    """``params.npz``'s arrays ``p0, p1, ...`` parsed by their headers (bounded by the bytes; no pickle)."""
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            infos = z.infolist()
            names = [f"p{i}.npy" for i in range(len(infos))]
            if sorted(i.filename for i in infos) != sorted(names):
                raise bad(f"params.npz holds {len(infos)} members that are not p0.npy .. p{len(infos) - 1}.npy")
            arrays = []
            for name in names:
                info = z.getinfo(name)
                if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
                    raise bad(f"params.npz: {name} is compressed; the format stores arrays uncompressed")
                arrays.append(_read_npy(z.read(name), f"params.npz: {name}", bad))
    except ExportedFileError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, struct.error) as e:
        raise bad(f"params.npz is not a readable npz ({type(e).__name__}: {e})") from None
    return arrays


def _read_npy(data: bytes, what: str, bad) -> np.ndarray:
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
    except (ValueError, OSError) as e:
        raise bad(f"{what} has no valid .npy header ({e})") from None
    if dtype.hasobject:
        raise bad(f"{what} holds Python objects; parameters are numeric arrays")
    count = 1
    for d in shape:
        count *= d
    body = len(data) - f.tell()
    if count * dtype.itemsize != body:
        raise bad(f"{what}'s header claims {shape} {dtype} ({count * dtype.itemsize} bytes) but {body} bytes follow")
    array = np.frombuffer(data, dtype, count, f.tell())
    array = array.reshape(shape[::-1]).T if fortran else array.reshape(shape)
    if array.dtype.kind in "fc" and not np.isfinite(array).all():
        raise bad(f"{what} holds {np.count_nonzero(~np.isfinite(array))} NaN or infinite values")
    return array
