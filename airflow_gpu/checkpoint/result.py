"""The training code's result: rank 0 writes JSON to $AIRFLOW_GPU_RESULT_PATH (/airflow/xcom/return.json,
KubernetesPodOperator's convention) and it becomes `result` in the task's XCom record (ENV.md)."""

from __future__ import annotations

import json
import os
from typing import Any

from airflow_gpu import constants as C

RESULT_MAX_BYTES = C.RESULT_MAX_BYTES  # what a kubelet keeps of the file (the container's termination message)


def write_result(value: Any, path: str | None = None) -> str:
    """Write `value` as the task's result (call it from rank 0, once, at the end); returns the path.
    Raises ValueError when it is not JSON-serialisable or its JSON is over RESULT_MAX_BYTES: keep large
    outputs in the checkpoint store and return their URI."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    if len(text.encode("utf-8")) > RESULT_MAX_BYTES:
        raise ValueError(f"the result is {len(text.encode('utf-8'))} bytes of JSON; at most {RESULT_MAX_BYTES} "
                         "reach the task (return a metric or a URI, not the data)")
    target = path or os.environ.get(C.ENV_RESULT_PATH) or C.RESULT_PATH
    os.makedirs(os.path.dirname(target), exist_ok=True)
    # written in place, not renamed over: in a pod the file is a bind mount of the kubelet's
    with open(target, "w", encoding="utf-8") as fh:
        fh.write(text)
    return target


__all__ = ["RESULT_MAX_BYTES", "write_result"]
