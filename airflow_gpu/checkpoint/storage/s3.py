"""The s3:// backend (boto3; interface: base.py). Endpoint, credentials and region come from explicit
arguments or the standard AWS environment (AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION / AWS_DEFAULT_REGION, AWS_PROFILE), exactly as
boto3 reads them.

Network failures and 5xx answers are retried here with exponential back-off and jitter (botocore's
own retries are switched off so the back-off, the log lines and the final error are ours) for as long
as an outage may last: `outage_seconds`, default AIRFLOW_GPU_S3_OUTAGE_SECONDS or 300 s (an S3 or
network outage of minutes must not fail a multi-day training); `max_attempts` bounds the tries too
when given. The final error names the endpoint, the operation and how long it tried.
"""

from __future__ import annotations

import logging
import os
import random
import time
from datetime import datetime
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectionError as BotoConnectionError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
)

from airflow_gpu import constants as C
from airflow_gpu.checkpoint.errors import CheckpointError, ConfigError, StoreUnavailableError
from airflow_gpu.checkpoint.layout import check_key
from airflow_gpu.checkpoint.storage.base import CHUNK, AlreadyExists, Backend, ListedObject, ObjectMissing

log = logging.getLogger(__name__)
T = TypeVar("T")

MIN_PART_SIZE = 5 * 1024 * 1024  # S3 rejects smaller non-final multipart parts (EntityTooSmall)
_RETRYABLE_EXC = (BotoConnectionError, ConnectionClosedError, ReadTimeoutError, IncompleteReadError, ResponseStreamingError)
# ConditionalRequestConflict (409): a concurrent conditional write on the key; retrying yields 412
# if the other write won
_RETRYABLE_CODES = {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "ConditionalRequestConflict"}


def _outage_seconds_from_env() -> float:
    raw = os.environ.get(C.ENV_S3_OUTAGE_SECONDS)
    if not raw:
        return C.DEFAULT_S3_OUTAGE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:
        raise ConfigError(f"{C.ENV_S3_OUTAGE_SECONDS}={raw!r}: must be seconds between 0 and 86400 "
                          f"(default {C.DEFAULT_S3_OUTAGE_SECONDS:g})")
    return value


class S3Backend(Backend):
    min_part_size = MIN_PART_SIZE

    def __init__(
        self,
        uri: str,
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        max_attempts: int | None = None,
        outage_seconds: float | None = None,
        backoff_base: float = 0.2,
        backoff_max: float = 10.0,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        max_pool_connections: int = 32,
        client: Any = None,
    ) -> None:
        parsed = urlparse(uri)
        if not parsed.netloc:
            raise ConfigError(f"S3 URI {uri!r} has no bucket: use s3://bucket/prefix")
        if max_attempts is not None and max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {max_attempts}")
        outage_seconds = outage_seconds if outage_seconds is not None else _outage_seconds_from_env()
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.prefix = self.prefix + "/" if self.prefix else ""
        self.uri = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.max_attempts = max_attempts
        self.outage_seconds = outage_seconds
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        if client is None:
            session = boto3.session.Session(
                aws_access_key_id=aws_access_key_id,
                aws_secret_access_key=aws_secret_access_key,
                aws_session_token=aws_session_token,
                region_name=region_name,
            )
            # boto3 reads these itself; here they only decide the addressing style (custom S3
            # servers such as SeaweedFS or MinIO want path-style URLs)
            endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            config = Config(
                retries={"total_max_attempts": 1},
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                max_pool_connections=max_pool_connections,
                # checksums are computed and verified by the library per part (CRC32, in the
                # manifest); botocore's own CRC would hash every byte a second time
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                s3={"addressing_style": "path"} if endpoint else None,
            )
            region = session.region_name or "us-east-1"
            client = session.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)
        self.client = client
        self.endpoint = client.meta.endpoint_url

    # --- retries ---------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T]) -> T:
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                if status < 500 and exc.response.get("Error", {}).get("Code") not in _RETRYABLE_CODES:
                    raise
                error: Exception = exc
            except _RETRYABLE_EXC as exc:
                error = exc
            delay = min(self.backoff_max, self.backoff_base * 2 ** min(attempt - 1, 30)) * random.uniform(0.5, 1.0)
            waited = time.monotonic() - started
            if (self.max_attempts is not None and attempt >= self.max_attempts) or waited + delay > self.outage_seconds:
                raise StoreUnavailableError(
                    f"S3 endpoint {self.endpoint} unreachable: {what} failed {attempt} times over "
                    f"{waited:.1f}s with back-off (last error: {error}). Check the endpoint (AWS_ENDPOINT_URL), "
                    f"network and credentials ({C.ENV_S3_OUTAGE_SECONDS}={self.outage_seconds:g} s is how long an "
                    f"outage is waited out); nothing was committed by this call."
                ) from error
            left = f"/{self.max_attempts - 1}" if self.max_attempts is not None else \
                f" ({self.outage_seconds - waited:.0f}s of the outage window left)"
            log.warning("S3 %s failed (%s); retry %d%s in %.2fs", what, error, attempt, left, delay)
            time.sleep(delay)

    def _what(self, op: str, key: str) -> str:
        return f"{op} s3://{self.bucket}/{self.prefix}{key}"

    # --- primitives ------------------------------------------------------------------------
    def put(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self.prefix + check_key(key), "Body": data}
        if create_only:
            kwargs["IfNoneMatch"] = "*"
        try:
            self._call(self._what("PutObject", key), lambda: self.client.put_object(**kwargs))
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412:
                raise AlreadyExists(f"{self.uri}/{key} already exists") from None
            raise self._client_error("PutObject", key, exc) from exc

    def read(self, key: str, consume: Callable[[Iterator[bytes]], T], start: int | None = None, length: int | None = None) -> T:
        """consume(chunks) over the object (or its byte range), streamed; on a network failure the
        whole range is fetched again and consume is called afresh."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self.prefix + check_key(key)}
        if length is not None:
            if length == 0:
                return consume(iter(()))
            kwargs["Range"] = f"bytes={start or 0}-{(start or 0) + length - 1}"
        elif start:
            kwargs["Range"] = f"bytes={start}-"

        def fetch() -> T:
            body = self.client.get_object(**kwargs)["Body"]
            try:
                return consume(body.iter_chunks(CHUNK))
            finally:
                body.close()

        try:
            return self._call(self._what("GetObject", key), fetch)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                raise ObjectMissing(f"{self.uri}/{key} does not exist") from None
            raise self._client_error("GetObject", key, exc) from exc

    def list(self, prefix: str, *, max_keys: int | None = None) -> list[ListedObject]:
        found: list[ListedObject] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix}
            if max_keys is not None:
                kwargs["MaxKeys"] = min(1000, max_keys - len(found))
            if token:
                kwargs["ContinuationToken"] = token
            page = self._list_page(prefix, kwargs)
            skip = len(self.prefix)
            for o in page.get("Contents", ()):
                modified: datetime = o["LastModified"]
                found.append(ListedObject(o["Key"][skip:], int(o["Size"]), modified.timestamp()))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token or (max_keys is not None and len(found) >= max_keys):
                return found if max_keys is None else found[:max_keys]

    def list_dirs(self, prefix: str) -> list[str]:
        names: list[str] = []
        token: str | None = None
        full = self.prefix + prefix
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full, "Delimiter": "/"}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._list_page(prefix, kwargs)
            names += [p["Prefix"][len(full) :].rstrip("/") for p in page.get("CommonPrefixes", ())]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return names

    def _list_page(self, prefix: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._call(self._what("ListObjectsV2", prefix), lambda: self.client.list_objects_v2(**kwargs))
        except ClientError as exc:
            raise self._client_error("ListObjectsV2", prefix, exc) from exc

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            batch = [{"Key": self.prefix + check_key(k)} for k in keys[i : i + 1000]]
            try:
                answer = self._call(
                    self._what("DeleteObjects", keys[i]),
                    lambda: self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}),
                )
            except ClientError as exc:
                raise self._client_error("DeleteObjects", keys[i], exc) from exc
            errors = [e for e in answer.get("Errors", ()) if e.get("Code") != "NoSuchKey"]
            if errors:
                raise CheckpointError(f"S3 endpoint {self.endpoint}: deleting from {self.uri} failed for {errors[:3]}")

    # --- multipart -------------------------------------------------------------------------
    def multipart_begin(self, key: str) -> Any:
        full = self.prefix + check_key(key)
        try:
            answer = self._call(
                self._what("CreateMultipartUpload", key),
                lambda: self.client.create_multipart_upload(Bucket=self.bucket, Key=full),
            )
        except ClientError as exc:
            raise self._client_error("CreateMultipartUpload", key, exc) from exc
        return {"key": key, "upload_id": answer["UploadId"], "etags": {}}

    def multipart_put(self, handle: Any, index: int, offset: int, data: bytes) -> None:
        key = handle["key"]
        try:
            answer = self._call(
                self._what(f"UploadPart #{index + 1}", key),
                lambda: self.client.upload_part(
                    Bucket=self.bucket, Key=self.prefix + key, UploadId=handle["upload_id"], PartNumber=index + 1, Body=data
                ),
            )
        except ClientError as exc:
            raise self._client_error("UploadPart", key, exc) from exc
        handle["etags"][index + 1] = answer["ETag"]

    def multipart_complete(self, handle: Any) -> None:
        key = handle["key"]
        parts = [{"PartNumber": n, "ETag": etag} for n, etag in sorted(handle["etags"].items())]
        try:
            self._call(
                self._what("CompleteMultipartUpload", key),
                lambda: self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=self.prefix + key, UploadId=handle["upload_id"], MultipartUpload={"Parts": parts}
                ),
            )
        except ClientError as exc:
            raise self._client_error("CompleteMultipartUpload", key, exc) from exc

    def multipart_abort(self, handle: Any) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.prefix + handle["key"], UploadId=handle["upload_id"])
        except (ClientError, BotoCoreError) as exc:  # best effort: GC aborts leftovers later
            log.warning("aborting multipart upload of %s/%s failed: %s", self.uri, handle["key"], exc)

    def clean_temp(self, older_than: float) -> int:
        """Abort multipart uploads under this prefix started more than `older_than` seconds ago
        (writers killed mid-upload leave them behind, holding storage)."""
        cutoff = time.time() - older_than
        aborted = 0
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix}
        while True:
            try:
                page = self._call(self._what("ListMultipartUploads", ""), lambda: self.client.list_multipart_uploads(**kwargs))
            except ClientError as exc:
                raise self._client_error("ListMultipartUploads", "", exc) from exc
            for upload in page.get("Uploads", ()):
                if upload["Initiated"].timestamp() < cutoff:
                    self.multipart_abort({"key": upload["Key"][len(self.prefix) :], "upload_id": upload["UploadId"]})
                    aborted += 1
            if not page.get("IsTruncated"):
                return aborted
            kwargs["KeyMarker"] = page.get("NextKeyMarker")
            kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker")

    def _client_error(self, op: str, key: str, exc: ClientError) -> CheckpointError:
        err = exc.response.get("Error", {})
        hint = ""
        if err.get("Code") in ("NoSuchBucket",):
            hint = f" Create bucket {self.bucket!r} first or fix the checkpoint URI."
        elif err.get("Code") in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            hint = " Check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or the role) for this bucket."
        return CheckpointError(f"S3 endpoint {self.endpoint}: {self._what(op, key)} failed: {err.get('Code')}: {err.get('Message')}.{hint}")
