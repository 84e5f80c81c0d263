"""Kubernetes objects in their wire format (camelCase dicts), whichever client produced them."""

from __future__ import annotations

from typing import Any


def as_dict(obj: Any) -> Any:
    """A wire-format dict for a client model object (kubernetes or kubernetes_asyncio), or a dict
    (returned as is)."""
    if isinstance(obj, dict):
        return obj
    from kubernetes.client import ApiClient  # only needed for client model objects

    return ApiClient().sanitize_for_serialization(obj)
