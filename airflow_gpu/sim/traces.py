"""Loaders for the Alibaba openb trace CSVs (the FGD artifact's node and pod lists).

Nodes: sn, cpu_milli, memory_mib, gpu, model. Pods: name, cpu_milli, memory_mib, num_gpu, gpu_milli
[, gpu_spec, qos, pod_phase, creation_time, deletion_time, scheduled_time]. num_gpu = 1 with
gpu_milli < 1000 is a share of one GPU; otherwise num_gpu whole GPUs; gpu_spec "A|B" lists the
accepted GPU models.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from airflow_gpu.core.model import GPU_MILLI, Node, PodRequest

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class TraceError(ValueError):
    """A trace file is missing, has the wrong columns or a bad value; the message names the spot."""


@dataclass(frozen=True)
class TracePod:
    """A pod of the trace as the simulator replays it (times are seconds in the trace, or None)."""

    request: PodRequest
    qos: str = ""
    creation_time: int | None = None
    deletion_time: int | None = None
    scheduled_time: int | None = None  # None: the trace never scheduled it


def _rows(path: Path, required: tuple[str, ...]):
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in required if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; expected at least {', '.join(required)}")
        for line, row in enumerate(reader, start=2):
            yield line, row


def _int(path, line, row, column) -> int:
    raw = (row.get(column) or "").strip()
    try:
        value = int(raw)
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column} must be an integer, got {raw!r}") from None
    if value < 0:
        raise TraceError(f"{path}:{line}: column {column} must not be negative, got {value}")
    return value


def load_nodes(path) -> list[Node]:
    nodes = []
    for line, row in _rows(path, NODE_COLUMNS):
        gpus = _int(path, line, row, "gpu")
        model = (row.get("model") or "").strip() or None
        if gpus and not model:
            raise TraceError(f"{path}:{line}: node {row['sn']} has {gpus} GPUs but no model; fill the model column")
        nodes.append(
            Node(
                name=row["sn"].strip(),
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpu_count=gpus,
                gpu_product=model if gpus else None,
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes


def _opt_int(row, column):
    raw = (row.get(column) or "").strip()
    return int(raw) if raw.lstrip("-").isdigit() else None


def load_pods(path) -> list[TracePod]:
    pods = []
    for line, row in _rows(path, POD_COLUMNS):
        name = row["name"].strip()
        count = _int(path, line, row, "num_gpu")
        milli = _int(path, line, row, "gpu_milli")
        if count == 0 and milli:
            raise TraceError(f"{path}:{line}: pod {name} has gpu_milli={milli} but num_gpu=0; set num_gpu=1 for a share")
        if count > 1 and milli != GPU_MILLI:
            raise TraceError(
                f"{path}:{line}: pod {name} asks {count} GPUs of {milli} milli; multi-GPU pods take whole GPUs "
                f"(gpu_milli={GPU_MILLI})"
            )
        if count and not 0 < milli <= GPU_MILLI:
            raise TraceError(f"{path}:{line}: pod {name}: gpu_milli must be 1..{GPU_MILLI} for a GPU pod, got {milli}")
        spec = (row.get("gpu_spec") or "").strip()
        products = tuple(p for p in spec.split("|") if p) if (spec and count) else ()
        share = count == 1 and milli < GPU_MILLI
        request = PodRequest(
            name=name,
            cpu_milli=_int(path, line, row, "cpu_milli"),
            memory_mib=_int(path, line, row, "memory_mib"),
            gpus=0 if share else count,
            gpu_milli=milli if share else 0,
            gpu_products=products,
        )
        pods.append(
            TracePod(
                request,
                qos=(row.get("qos") or "").strip(),
                creation_time=_opt_int(row, "creation_time"),
                deletion_time=_opt_int(row, "deletion_time"),
                scheduled_time=_opt_int(row, "scheduled_time"),
            )
        )
    if not pods:
        raise TraceError(f"{path}: no pods")
    return pods


def trace_name(path) -> str:
    """'openb_pod_list_default.csv' -> 'openb_pod_list_default' (the anchors' trace key)."""
    return Path(path).name.removesuffix(".csv")
