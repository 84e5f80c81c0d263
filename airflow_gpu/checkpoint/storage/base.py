"""What a checkpoint store is to the protocol: the Backend interface, its errors, the listing record
and the URI check, shared by the file:// backend (file.py) and the S3 backend (s3.py).

Every backend offers put (optionally create-only: the conditional write that commits a manifest),
ranged get, sorted listing, delete, and multipart upload of large objects in parallel parts.
Standard library only: this module imports neither backend (open_backend, in this package's
__init__, chooses one by URI scheme).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, TypeVar

from airflow_gpu.checkpoint.errors import CheckpointError


T = TypeVar("T")
CHUNK = 1024 * 1024  # streamed reads: hashed and written while the next chunk arrives


class ObjectMissing(CheckpointError, KeyError):
    """The key does not exist."""


class AlreadyExists(CheckpointError):
    """A create-only put found the key already present (S3: 412 Precondition Failed)."""


@dataclass(frozen=True)
class ListedObject:
    key: str  # relative to the store prefix
    size: int
    modified: float  # unix seconds, the store's clock


class Backend(Protocol):
    uri: str  # the store URI, for messages
    endpoint: str  # where the bytes go (S3 endpoint URL or directory), for messages

    def put(self, key: str, data: bytes, *, create_only: bool = False) -> None: ...
    def read(self, key: str, consume: Callable[[Iterator[bytes]], T], start: int | None = None, length: int | None = None) -> T: ...
    def list(self, prefix: str, *, max_keys: int | None = None) -> list[ListedObject]: ...
    def list_dirs(self, prefix: str) -> list[str]: ...
    def delete(self, keys: list[str]) -> None: ...
    def multipart_begin(self, key: str) -> Any: ...
    def multipart_put(self, handle: Any, index: int, offset: int, data: bytes) -> None: ...
    def multipart_complete(self, handle: Any) -> None: ...
    def multipart_abort(self, handle: Any) -> None: ...

    def clean_temp(self, older_than: float) -> int:
        """Remove what writers killed mid-write left behind (older than `older_than` seconds)."""
        ...

    def get(self, key: str, start: int | None = None, length: int | None = None) -> bytes:
        """The object (or its byte range) in one piece."""
        return self.read(key, b"".join, start, length)


def uri_problem(uri: object) -> str | None:
    """Why `uri` cannot be a checkpoint store, or None: s3://bucket[/prefix] or file:///absolute/path."""
    if not isinstance(uri, str) or "://" not in uri:
        return f"checkpoint URI {uri!r} must look like s3://bucket/prefix or file:///absolute/path"
    scheme, rest = uri.split("://", 1)
    if scheme.lower() not in ("s3", "file"):
        return f"checkpoint URI {uri!r}: scheme {scheme.lower()!r} is not supported; use s3:// or file://"
    if scheme.lower() == "s3" and not rest.split("/", 1)[0]:
        return f"checkpoint URI {uri!r} has no bucket: use s3://bucket/prefix"
    if scheme.lower() == "file" and not rest.startswith(("/", "localhost/")):
        return f"file URI {uri!r} must be absolute: file:///path/to/checkpoints"
    return None
