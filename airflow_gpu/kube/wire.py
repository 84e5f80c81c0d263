"""Kubernetes objects in their wire format (camelCase dicts), whichever client produced them, and
the one parser of the times they carry (RFC 3339). Imports no client: the triggerer and the UI read
times here without loading the kubernetes package."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any


def as_dict(obj: Any) -> Any:
    """A wire-format dict for a client model object (kubernetes or kubernetes_asyncio), or a dict
    (returned as is)."""
    if isinstance(obj, dict):
        return obj
    from kubernetes.client import ApiClient  # only needed for client model objects

    return ApiClient().sanitize_for_serialization(obj)


class ConversionError(ValueError):
    """An object the scheduler cannot understand; the message names the object and the field."""


def parse_time(value: Any) -> float | None:
    """RFC 3339 string, datetime or epoch seconds -> epoch seconds. Anything else (not a time, not
    finite, before 1970 or after 9999) raises ConversionError naming the value."""
    if value in (None, ""):
        return None
    if isinstance(value, bool):
        raise ConversionError(f"{value!r} is not a time (RFC 3339, e.g. 2026-01-02T03:04:05Z)")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, datetime):
        seconds = _timestamp(value)
    else:
        text = str(value).strip()[:64]
        try:
            seconds = float(text)
        except ValueError:
            try:
                seconds = _timestamp(datetime.fromisoformat(text.replace("Z", "+00:00")))
            except (ValueError, OverflowError):
                raise ConversionError(f"{text!r} is not a time (RFC 3339, e.g. 2026-01-02T03:04:05Z)") from None
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_EPOCH_SECONDS:
        raise ConversionError(f"{value!r} is not a time between 1970 and 9999")
    return seconds


MAX_EPOCH_SECONDS = 253402300799.0  # 9999-12-31T23:59:59Z


def _timestamp(dt: datetime) -> float:
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def api_time(value: Any) -> float | None:
    """A time the API server or the operator wrote (status.startTime, finishedAt, an annotation), as
    epoch seconds; None when absent or unreadable (parse_time's rule, without the error)."""
    try:
        return parse_time(value)
    except ConversionError:
        return None
