"""Object stores for checkpoints: the interface in base.py, a directory in file.py, S3 in s3.py.

open_backend picks one by URI scheme. The S3 backend is imported only for s3:// URIs, so file://
needs no boto3; neither backend imports this module (no import circle).
"""

from __future__ import annotations

from typing import Any

from airflow_gpu.checkpoint.errors import ConfigError
from airflow_gpu.checkpoint.storage.base import AlreadyExists, Backend, ListedObject, ObjectMissing, uri_problem
from airflow_gpu.checkpoint.storage.file import FileBackend

__all__ = ["AlreadyExists", "Backend", "FileBackend", "ListedObject", "ObjectMissing", "open_backend", "uri_problem"]


def open_backend(uri: str, **options: Any) -> Backend:
    """file:///abs/path or s3://bucket/prefix. S3 options: see storage.s3.S3Backend."""
    problem = uri_problem(uri)
    if problem:
        raise ConfigError(problem)
    scheme = uri.split("://", 1)[0].lower()
    if scheme == "file":
        if options:
            raise ConfigError(f"options {sorted(options)} apply to s3:// URIs only, not to {uri}")
        return FileBackend(uri)
    if scheme == "s3":
        from airflow_gpu.checkpoint.storage.s3 import S3Backend

        return S3Backend(uri, **options)
    raise AssertionError(scheme)  # uri_problem admits only the two schemes
