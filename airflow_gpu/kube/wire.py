"""Kubernetes objects in their wire format (camelCase dicts), whichever client produced them."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def as_dict(obj: Any) -> Any:
    """A wire-format dict for a client model object (kubernetes or kubernetes_asyncio), or a dict
    (returned as is)."""
    if isinstance(obj, dict):
        return obj
    from kubernetes.client import ApiClient  # only needed for client model objects

    return ApiClient().sanitize_for_serialization(obj)


def parse_time(value: Any) -> float | None:
    """RFC 3339 string, datetime or epoch seconds -> epoch seconds."""
    if value in (None, ""):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime):
        dt = value
    else:
        text = str(value).strip()
        try:
            return float(text)
        except ValueError:
            pass
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()
