"""The environment contract between the operator and the training code (documented in ENV.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from airflow_gpu import constants as C
from airflow_gpu.checkpoint.errors import ConfigError


@dataclass(frozen=True)
class TrainingEnv:
    checkpoint_uri: str | None
    resume_uri: str | None
    attempt: int
    interruptions: int
    deadline: datetime | None
    keep_last: int | None
    keep_every: int | None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "TrainingEnv":
        env = os.environ if environ is None else environ
        return cls(
            checkpoint_uri=env.get(C.ENV_CHECKPOINT_URI) or None,
            resume_uri=env.get(C.ENV_RESUME_URI) or None,
            attempt=env_number(env, C.ENV_ATTEMPT, 0),
            interruptions=env_number(env, C.ENV_INTERRUPTIONS, 0),
            deadline=_deadline(env.get(C.ENV_DEADLINE)),
            keep_last=env_number(env, C.ENV_CHECKPOINT_KEEP_LAST, None, minimum=1),
            keep_every=env_number(env, C.ENV_CHECKPOINT_KEEP_EVERY, None, minimum=1),
        )


def env_number(
    env: Mapping[str, str], name: str, default: float | None, kind: type = int, minimum: float = 0
) -> float | None:
    """A numeric environment variable (int or float), or `default` when unset or empty."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} must be {'an integer' if kind is int else 'a number'} >= {minimum}") from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be {'an integer' if kind is int else 'a number'} >= {minimum}")
    return value


def _deadline(raw: str | None) -> datetime | None:
    if not raw or not raw.strip():
        return None
    raw = raw.strip()
    try:
        if raw.replace(".", "", 1).isdigit():
            return datetime.fromtimestamp(float(raw), tz=timezone.utc)
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise ConfigError(
            f"{C.ENV_DEADLINE}={raw!r} must be RFC 3339 with a timezone (2026-12-02T15:00:00Z) or unix seconds"
        ) from None
    if value.tzinfo is None:
        raise ConfigError(f"{C.ENV_DEADLINE}={raw!r} has no timezone: append Z or +00:00")
    return value
