"""Issue 10 (minor): a fence far beyond any real attempt (9999999999, written by hand or by a
hostile manifest writer) does not fence a store forever; attempts beyond the bound are refused."""

from __future__ import annotations

import pytest

from airflow_gpu.checkpoint import Checkpointer, ConfigError
from airflow_gpu.checkpoint.layout import MAX_RUN_ATTEMPT, fence_key


def test_a_fence_beyond_the_attempt_bound_is_not_obeyed(checkpoint_store_uri):
    uri = checkpoint_store_uri
    first = Checkpointer(uri, attempt=1, handle_sigterm=False)
    first.save(1, b"one")
    # a stray fence of attempt 9999999999 next to the real ones
    first.store.backend.put(fence_key(9_999_999_999), b'{"attempt": 9999999999}', create_only=True)
    second = Checkpointer(uri, attempt=2, handle_sigterm=False)
    second.claim()
    saved = second.save(2, b"two")
    assert second.store.highest_attempt() == 2
    assert second.store.latest().key == saved.key
    with pytest.raises(ConfigError, match=f"0..{MAX_RUN_ATTEMPT}"):
        Checkpointer(uri, attempt=MAX_RUN_ATTEMPT + 1, handle_sigterm=False)
