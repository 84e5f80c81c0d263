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


def text_encoding(head: bytes) -> str:
    """The encoding of a text file whose first bytes are `head`: UTF-16 when it says so (PowerShell's
    `>`), else UTF-8 with or without a BOM (Excel's "CSV UTF-8" starts with one, which would glue
    itself to the first column's name)."""
    return "utf-16" if head[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-8-sig"


def _near(a: str, b: str) -> bool:
    """A typo of `b`: one edit apart (a letter added, dropped, changed or two swapped), two for a
    long name. `time` is not taken for `tier` (two edits, short names)."""
    if abs(len(a) - len(b)) > 2 or a == b:
        return False
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)] <= (2 if len(b) >= 8 else 1)


def _header(path: Path, fieldnames, required: tuple[str, ...], known: tuple[str, ...] | None) -> list[str]:
    """The header's names as read (trimmed, lower case); a missing required column, or one that is a
    typo of a column this format reads (its values would be dropped without a word), is an error
    showing the header found."""
    names = [(f or "").strip().lower().replace("-", "_").replace(" ", "_") for f in fieldnames or ()]
    found = ", ".join(repr(f) for f in fieldnames or ()) or "nothing (an empty file)"
    missing = [c for c in required if c not in names]
    if missing:
        hints = [f"{n!r} for {c}?" for c in missing for n in names if _near(n, c)]
        raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; expected at least {', '.join(required)}, "
                         f"comma-separated, on the first line; found {found}" + (f" ({'; '.join(hints)})" if hints else ""))
    if known is not None:
        for n in names:
            close = [c for c in known if _near(n, c)] if n not in known else []
            if close:
                raise TraceError(f"{path}: column {n!r} is not one this format reads, and its values would be "
                                 f"ignored; did you mean {close[0]!r}? Rename it, or remove the column")
    return names


def _rows(path: Path, required: tuple[str, ...], known: tuple[str, ...] | None = None):
    """(line number, row dict) of a CSV whose header names `required` (and, with `known`, no typo of
    a column the format reads). Comma-separated; a header of tabs or semicolons and no comma is read
    with that separator; names are matched trimmed and in lower case."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    try:
        with path.open("rb") as fh:
            head = fh.read(2)
        with path.open(newline="", encoding=text_encoding(head)) as fh:
            first = fh.readline()
            fh.seek(0)
            delimiter = "," if "," in first else "\t" if "\t" in first else ";" if ";" in first else ","
            reader = csv.DictReader(fh, delimiter=delimiter, skipinitialspace=True)
            reader.fieldnames = _header(path, reader.fieldnames, required, known)
            for line, row in enumerate(reader, start=2):
                yield line, row
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8 "
                         "(\"CSV UTF-8\" in a spreadsheet)") from None


def _unique_name(path, line, row, column: str, what: str, seen: dict[str, int]) -> str:
    """The row's name in `column`, refused when empty or already the name of an earlier line (`seen`:
    name -> line, updated)."""
    name = (row.get(column) or "").strip()
    if not name:
        raise TraceError(f"{path}:{line}: column {column} is empty; every {what} needs a unique name")
    if name in seen:
        raise TraceError(f"{path}:{line}: column {column} {name!r} is also the {what} of line {seen[name]}; "
                         f"{what} names must be unique")
    seen[name] = line
    return name


def _integer(raw: str) -> int:
    """An integer, also when written as a float with no fraction ("8.0": what pandas writes)."""
    try:
        return int(raw)
    except ValueError:
        value = float(raw)  # ValueError for anything else
        if not value.is_integer():
            raise
        return int(value)


def _int(path, line, row, column) -> int:
    raw = (row.get(column) or "").strip()
    try:
        value = _integer(raw)
    except (ValueError, OverflowError):
        raise TraceError(f"{path}:{line}: column {column} must be an integer, got {raw!r}") from None
    if value < 0:
        raise TraceError(f"{path}:{line}: column {column} must not be negative, got {value}")
    return value


def load_nodes(path) -> list[Node]:
    nodes = []
    seen: dict[str, int] = {}
    for line, row in _rows(path, NODE_COLUMNS, NODE_COLUMNS):
        name = _unique_name(path, line, row, "sn", "node", seen)
        gpus = _int(path, line, row, "gpu")
        model = (row.get("model") or "").strip() or None
        if gpus and not model:
            raise TraceError(f"{path}:{line}: node {name} has {gpus} GPUs but no model; fill the model column")
        nodes.append(
            Node(
                name=name,
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpu_count=gpus,
                gpu_product=model if gpus else None,
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    if not any(n.gpu_count for n in nodes):
        raise TraceError(f"{path}: no node has a GPU (column gpu); a replay needs GPU nodes")
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
