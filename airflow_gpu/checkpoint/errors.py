"""Errors of the checkpoint library. Every message names what failed and what to do about it."""

from __future__ import annotations


class CheckpointError(Exception):
    """Base class: anything the checkpoint library raises on purpose."""


class ConfigError(CheckpointError, ValueError):
    """Bad input (URI, step, attempt, option): raised before anything is written."""


class StaleAttemptError(CheckpointError):
    """This writer's attempt has been superseded by a newer attempt: it must not commit.

    Raised by save() of a zombie (an earlier attempt still running after the operator started a
    newer one). The newer attempt's checkpoints are untouched; the zombie should exit."""

    def __init__(self, attempt: int, newer_attempt: int, uri: str, detail: str = "") -> None:
        self.attempt = attempt
        self.newer_attempt = newer_attempt
        self.uri = uri
        super().__init__(
            f"attempt {attempt} is stale: attempt {newer_attempt} has claimed checkpoint store {uri}; "
            f"this writer's checkpoint was not committed{detail}. An earlier attempt must stop "
            f"(the operator started a newer one); exit instead of retrying."
        )


class CheckpointExistsError(CheckpointError):
    """A manifest for the same (attempt, step) already exists and was written by someone else."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's manifest is unreadable, or a data object is missing or fails its checksum."""


class StoreUnavailableError(CheckpointError, ConnectionError):
    """The object store did not answer after retries with back-off."""
