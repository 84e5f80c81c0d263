"""Checkpointer: the training loop's handle. save() uploads data then commits a manifest with a
create-only put, fenced by attempt; resume() restores the newest complete checkpoint; SIGTERM turns
into should_stop() so the loop saves at its next safe point.

Fencing protocol (the guarantee is stated precisely in ENV.md, "Fencing"):
  claim:  put fences/<attempt> create-only (once per writer, before its first resume or save)
  save:   check highest claimed attempt -> upload data -> check again -> put manifest create-only
          -> check again; if a newer attempt claimed meanwhile, withdraw the manifest and raise.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from airflow_gpu import constants as C
from airflow_gpu.checkpoint.storage.base import AlreadyExists, ObjectMissing
from airflow_gpu.checkpoint.env import TrainingEnv
from airflow_gpu.checkpoint.errors import (CheckpointExistsError, ConfigError, CorruptCheckpointError, StaleAttemptError,
                                          StoreUnavailableError)
from airflow_gpu.checkpoint.layout import (
    DATA,
    STATUS,
    Checkpoint,
    check_attempt,
    check_step,
    encode_manifest,
    fence_key,
    manifest_key,
    new_save_id,
)
from airflow_gpu.checkpoint.retention import apply_retention, collect_garbage, delete_objects
from airflow_gpu.checkpoint.restore import Restored, restore_from_uri, restore_newest
from airflow_gpu.checkpoint.serialize import check_metadata, to_sources
from airflow_gpu.checkpoint.store import CheckpointStore
from airflow_gpu.checkpoint.transfer import upload

log = logging.getLogger(__name__)
MiB = 1024 * 1024


_OUTAGE_HOOK_INSTALLED = False


def _exit_on_store_outage() -> None:
    """A training process that dies of StoreUnavailableError (the store stayed unreachable through
    the whole outage window) exits with EXIT_CODE_STORE_UNAVAILABLE: the operator relaunches the
    gang as the next attempt of the same try instead of spending a retry on an infrastructure
    fault. Any other uncaught error keeps its usual exit (1: the application failed)."""
    global _OUTAGE_HOOK_INSTALLED
    if _OUTAGE_HOOK_INSTALLED:
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        if isinstance(value, StoreUnavailableError):
            sys.stderr.write(f"airflow-gpu: the checkpoint store is unavailable; exiting with "
                             f"{C.EXIT_CODE_STORE_UNAVAILABLE} (an infrastructure failure: the gang is "
                             f"relaunched, no retry is spent)\n")
            sys.stderr.flush()
            os._exit(C.EXIT_CODE_STORE_UNAVAILABLE)

    sys.excepthook = hook
    _OUTAGE_HOOK_INSTALLED = True


class Checkpointer:
    def __init__(
        self,
        uri: str,
        *,
        attempt: int = 0,
        resume_uri: str | None = None,
        interruptions: int = 0,
        keep_last: int = 3,
        keep_every: int | None = None,
        part_size: int = 8 * MiB,  # what boto3 uses; SeaweedFS and S3 both do well with it
        workers: int = 10,
        gc_grace_seconds: float = 600.0,
        gc_every: int = 50,
        handle_sigterm: bool = True,
        store: CheckpointStore | None = None,
        **backend_options: Any,
    ) -> None:
        if keep_last < 1:
            raise ConfigError(f"keep_last must be >= 1 (the newest checkpoint is always kept), got {keep_last}")
        if keep_every is not None and keep_every < 1:
            raise ConfigError(f"keep_every must be >= 1 or None, got {keep_every}")
        self.store = store or CheckpointStore(uri, workers=workers, **backend_options)
        min_part = getattr(self.store.backend, "min_part_size", 1)
        if part_size < min_part:
            raise ConfigError(f"part_size {part_size} is below the store's minimum part size {min_part} ({self.store.uri})")
        self.uri = self.store.uri
        self.attempt = check_attempt(attempt)
        self.resume_uri = resume_uri
        self.interruptions = interruptions
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.part_size = part_size
        self.gc_grace_seconds = gc_grace_seconds
        self.gc_every = max(1, gc_every)
        self._saves = 0
        self._claimed = False
        self._committed: dict[int, Checkpoint] = {}
        self._stop = threading.Event()
        self.stop_requested_at: float | None = None
        self.env: TrainingEnv | None = None  # set by from_env()
        if handle_sigterm:
            self._install_sigterm_handler()
            _exit_on_store_outage()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "Checkpointer":
        """Configured from the operator's environment (ENV.md); keyword arguments override it."""
        env = TrainingEnv.from_environ(environ)
        uri = overrides.pop("uri", None) or env.checkpoint_uri
        if not uri:
            raise ConfigError(
                f"{C.ENV_CHECKPOINT_URI} is not set: the operator sets it in the pod; for a local run "
                f"export {C.ENV_CHECKPOINT_URI}=file:///tmp/checkpoints (or s3://bucket/prefix)"
            )
        options: dict[str, Any] = {
            "attempt": env.attempt,
            "resume_uri": env.resume_uri,
            "interruptions": env.interruptions,
        }
        if env.keep_last is not None:
            options["keep_last"] = env.keep_last
        if env.keep_every is not None:
            options["keep_every"] = env.keep_every
        options.update(overrides)
        checkpointer = cls(uri, **options)
        checkpointer.env = env
        return checkpointer

    # --- preemption ------------------------------------------------------------------------
    def _install_sigterm_handler(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("Checkpointer created outside the main thread: SIGTERM is not handled; call request_stop()")
            return
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum: int, frame: Any) -> None:
            self.request_stop()
            if callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGTERM, on_sigterm)

    def request_stop(self) -> None:
        """What SIGTERM does: from now on should_stop() is True. No I/O here (signal context)."""
        if not self._stop.is_set():
            self.stop_requested_at = time.time()
            self._stop.set()

    def should_stop(self) -> bool:
        """True once SIGTERM arrived: save now and exit with constants.EXIT_CODE_STOPPED."""
        return self._stop.is_set()

    # --- fencing ---------------------------------------------------------------------------
    def claim(self) -> None:
        """Claim this attempt in the store: from now on earlier attempts cannot commit."""
        if self._claimed:
            return
        try:
            body = json.dumps({"attempt": self.attempt, "claimed_at": time.time()}).encode()
            self.store.backend.put(fence_key(self.attempt), body, create_only=True)
        except AlreadyExists:
            pass  # this attempt claimed before (a restarted container of the same pod)
        self._claimed = True
        self._check_fence("at claim")

    def _check_fence(self, when: str) -> None:
        highest = self.store.highest_attempt()
        if highest is not None and highest > self.attempt:
            raise StaleAttemptError(self.attempt, highest, self.uri, f" ({when})")

    # --- saving ----------------------------------------------------------------------------
    def save(self, step: int, data: Any, metadata: Mapping[str, Any] | None = None) -> Checkpoint:
        """Upload `data` (bytes, file/dir path(s), {name: bytes|path}, numpy/torch state dict) as
        the checkpoint of `step`, then commit it. Returns the committed checkpoint."""
        step = check_step(step)
        meta = check_metadata(metadata)
        if step in self._committed:
            log.info("step %d is already checkpointed by this attempt: %s", step, self._committed[step].uri)
            self._write_status(self._committed[step], 0.0)  # records a stop request that came since
            return self._committed[step]
        kind, sources, extra = to_sources(data)
        started = time.monotonic()
        save_id = new_save_id(self.attempt, step)
        try:
            self.claim()
            self._check_fence("before upload")
            entries = upload(
                self.store.backend, self.store.pool, sources, lambda name: f"{DATA}{save_id}/{name}", self.part_size
            )
        finally:
            for src in sources:
                src.close()
        key = manifest_key(self.attempt, step)
        ckpt = Checkpoint(
            step=step,
            attempt=self.attempt,
            save_id=save_id,
            kind=kind,
            created_at=time.time(),
            metadata=meta,
            objects=tuple(entries),
            key=key,
            uri=f"{self.uri}/{key}",
            extra=extra | {"interruptions": self.interruptions},
        )
        try:
            self._check_fence("before commit")
        except StaleAttemptError:
            self._delete_save(save_id)
            raise
        self._commit(ckpt, encode_manifest(ckpt))
        try:
            self._check_fence("after commit")
        except StaleAttemptError as exc:
            # a newer attempt claimed between our check and our put: withdraw what we committed
            self.store.backend.delete([key])
            self._delete_save(save_id)
            raise StaleAttemptError(
                self.attempt, exc.newer_attempt, self.uri, " (its manifest raced with the claim and was withdrawn)"
            ) from None
        self._committed = {step: ckpt}
        seconds = time.monotonic() - started
        log.info("checkpoint step %d attempt %d committed: %s (%d bytes, %.2fs)", step, self.attempt, ckpt.uri, ckpt.total_bytes, seconds)
        self._write_status(ckpt, seconds)
        apply_retention(self.store, self.attempt, self.keep_last, self.keep_every)
        # saves killed before their commit predate this process (or belong to fenced attempts):
        # a full sweep at the first save and then every gc_every saves finds them
        if self._saves % self.gc_every == 0:
            collect_garbage(self.store, self.attempt, self.gc_grace_seconds)
        self._saves += 1
        return ckpt

    def _commit(self, ckpt: Checkpoint, body: bytes) -> None:
        backend = self.store.backend
        for _ in range(2):
            try:
                backend.put(ckpt.key, body, create_only=True)
                return
            except AlreadyExists:
                pass
            try:
                existing = backend.get(ckpt.key)
            except ObjectMissing:
                continue  # withdrawn meanwhile: try again
            if existing == body:
                return  # our own put landed and its answer was lost; the retry saw it
            try:
                self.store.check(self.store.load(ckpt.key), "objects")
            except CorruptCheckpointError as exc:
                log.warning("replacing a broken checkpoint of this attempt at the same step: %s", exc)
                self.store.forget(ckpt.key)
                backend.delete([ckpt.key])
                continue
            self._delete_save(ckpt.save_id)
            raise CheckpointExistsError(
                f"attempt {self.attempt} already committed step {ckpt.step} in {self.uri} ({ckpt.key}): steps must "
                "increase within an attempt; resume() before saving, or save a later step"
            )
        self._delete_save(ckpt.save_id)
        raise CheckpointExistsError(f"could not commit {ckpt.uri}: the key kept reappearing")

    def _delete_save(self, save_id: str) -> None:
        try:
            delete_objects(self.store, save_id)
        except Exception as exc:  # best effort: GC removes it later
            log.warning("could not delete data of save %s: %s", save_id, exc)

    def _write_status(self, ckpt: Checkpoint, seconds: float) -> None:
        status = {
            "attempt": self.attempt,
            "step": ckpt.step,
            "checkpoint_uri": ckpt.uri,
            "time": ckpt.created_at,
            "bytes": ckpt.total_bytes,
            "save_seconds": round(seconds, 3),
            "interruptions": self.interruptions,
            "stop_requested_at": self.stop_requested_at,
        }
        try:
            self.store.backend.put(STATUS, json.dumps(status).encode())
        except Exception as exc:  # the checkpoint is committed; a stale status only delays the UI
            log.warning("checkpoint committed but status record %s/%s not written: %s", self.uri, STATUS, exc)

    # --- resuming --------------------------------------------------------------------------
    def latest(self) -> Checkpoint | None:
        return self.store.latest()

    def resume(self, dest: str | Path | None = None) -> Restored | None:
        """Claim this attempt, then restore the newest checkpoint that verifies: from this store,
        else from the resume URI (another store or one checkpoint's URI). None: start fresh."""
        self.claim()
        restored = restore_newest(self.store, dest)
        if restored is None and self.resume_uri:
            restored = restore_from_uri(self.resume_uri, dest)
        return restored

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
