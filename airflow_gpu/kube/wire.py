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


def api_time(value: Any) -> float | None:
    """A time the API server wrote (status.startTime, finishedAt: RFC 3339), as epoch seconds;
    None when absent or unreadable."""
    if isinstance(value, datetime):
        return value.timestamp() if value.tzinfo else value.replace(tzinfo=timezone.utc).timestamp()
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
