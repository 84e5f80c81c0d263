"""Turning what save() is given into data objects, and objects back into what restore returns.

    bytes / bytearray / memoryview           -> kind "bytes", one object "data"
    a directory path                         -> kind "files", every regular file under it
    a file path, or a list of file paths     -> kind "files", objects named by file name
    {name: bytes | path}                     -> kind "files", objects named by the keys
    a state dict holding numpy arrays        -> kind "numpy", one object "state.npz" (no pickle)
    a state dict holding torch tensors       -> kind "torch", one object "state.pt" (torch.save;
                                                restored with weights_only=True)

numpy and torch are imported only when a state dict needs them.
"""

from __future__ import annotations

import io
import logging
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_gpu.checkpoint.errors import ConfigError
from airflow_gpu.checkpoint.layout import check_object_names
from airflow_gpu.checkpoint.transfer import Source

log = logging.getLogger(__name__)

BYTES_OBJECT = "data"
NUMPY_OBJECT = "state.npz"
TORCH_OBJECT = "state.pt"
_SEP = "/"


def _is_bytes(value: object) -> bool:
    return isinstance(value, (bytes, bytearray, memoryview))


def _is_path(value: object) -> bool:
    return isinstance(value, (str, os.PathLike))


def to_sources(data: object) -> tuple[str, list[Source], dict[str, Any]]:
    """(kind, sources, extra manifest fields) for save(); ConfigError for anything else."""
    if _is_bytes(data):
        return "bytes", [Source.from_bytes(BYTES_OBJECT, data)], {}  # type: ignore[arg-type]
    if _is_path(data):
        path = Path(data)  # type: ignore[arg-type]
        if path.is_dir():
            files = _files_inside(path)
            return "files", [Source.from_file(p.relative_to(path).as_posix(), p) for p in files], {}
        if path.is_file():
            return "files", [Source.from_file(path.name, path)], {}
        raise ConfigError(f"save(data={str(path)!r}): no such file or directory")
    if isinstance(data, (list, tuple)) and data and all(_is_path(p) for p in data):
        named = {Path(p).name: p for p in data}
        if len(named) != len(data):
            raise ConfigError("save(data=[paths]): two files share a name; pass {name: path} to name them")
        return _named_files(named)
    if isinstance(data, Mapping) and data and all(_is_bytes(v) or _is_path(v) for v in data.values()):
        return _named_files(data)
    if isinstance(data, Mapping):
        if _holds_torch(data):
            return "torch", [Source.from_bytes(TORCH_OBJECT, torch_bytes(data))], {}
        payload, scalars = numpy_bytes(data)
        return "numpy", [Source.from_bytes(NUMPY_OBJECT, payload)], {"python_scalars": scalars}
    raise ConfigError(
        f"save(data=...) got {type(data).__name__}: pass bytes, a file or directory path, a list of paths, "
        "{name: bytes|path}, or a state dict of numpy arrays / torch tensors"
    )


def _files_inside(root: Path) -> list[Path]:
    """Regular files under root. A symlink is saved as the file it points to only if that file is
    inside root too; one pointing out of the directory is skipped with a warning, never followed."""
    real_root = root.resolve()
    files = []
    for p in sorted(root.rglob("*")):
        if p.is_symlink():
            target = p.resolve()
            if not target.is_relative_to(real_root):
                log.warning("save(%s): skipping symlink %s -> %s: it points out of the directory", root, p, target)
                continue
        if p.is_file():
            files.append(p)
    return files


def _named_files(named: Mapping[str, Any]) -> tuple[str, list[Source], dict[str, Any]]:
    check_object_names(list(named))  # validate everything before opening anything
    for name, value in named.items():
        if not _is_bytes(value) and not Path(value).is_file():
            raise ConfigError(f"save(data={{{name!r}: {str(value)!r}}}): not a file")
    sources = [
        Source.from_bytes(name, value) if _is_bytes(value) else Source.from_file(name, Path(value))
        for name, value in named.items()
    ]
    return "files", sources, {}


def check_metadata(metadata: object) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise ConfigError(f"metadata must be a dict of JSON values, got {type(metadata).__name__}")
    try:
        json.dumps(metadata)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"metadata must be JSON-serialisable: {exc}") from None
    return dict(metadata)


# --- numpy ----------------------------------------------------------------------------------
def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if not isinstance(key, str) or not key or _SEP in key:
            raise ConfigError(f"state dict key {prefix + str(key)!r} must be a non-empty string without '{_SEP}'")
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}{_SEP}"))
        else:
            flat[prefix + key] = value
    return flat


def numpy_bytes(state: Mapping[str, Any]) -> tuple[bytes, list[str]]:
    """A nested dict of arrays / numbers as .npz bytes, plus the keys that were Python scalars."""
    import numpy as np

    arrays, scalars = {}, []
    for key, value in _flatten(state).items():
        if isinstance(value, (bool, int, float, str)):
            scalars.append(key)
        elif not isinstance(value, (np.ndarray, np.generic)):
            raise ConfigError(f"state dict value {key!r} is {type(value).__name__}: numpy state dicts hold arrays and numbers")
        array = np.asarray(value)
        if array.dtype == object:
            raise ConfigError(f"state dict value {key!r} has dtype object, which cannot be stored without pickle")
        arrays[key] = array
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **arrays)
    return buffer.getvalue(), sorted(scalars)


def numpy_state(raw: bytes | bytearray, scalars: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    import numpy as np

    state: dict[str, Any] = {}
    with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
        for flat_key in npz.files:
            value: Any = npz[flat_key]
            if flat_key in scalars:
                value = value.item()
            node = state
            *parents, leaf = flat_key.split(_SEP)
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
    return state


# --- torch (optional) -----------------------------------------------------------------------
def _holds_torch(tree: Any) -> bool:
    torch = sys.modules.get("torch")  # a tensor can only exist if torch was imported
    if torch is None:
        return False
    if isinstance(tree, torch.Tensor):
        return True
    if isinstance(tree, Mapping):
        return any(_holds_torch(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return any(_holds_torch(v) for v in tree)
    return False


def torch_bytes(state: Mapping[str, Any]) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def torch_state(raw: bytes | bytearray, map_location: Any = "cpu") -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError("this checkpoint holds a torch state dict: install torch to restore it") from None
    return torch.load(io.BytesIO(bytes(raw)), map_location=map_location, weights_only=True)
