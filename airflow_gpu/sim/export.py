"""Export a cluster's job history to the generic job CSV (sim/jobtrace.py) for `simulate replay --trace`.

    kubectl get workloads -A -o json > workloads.json
    python -m airflow_gpu.sim.export kueue workloads.json -o jobs.csv

    sacct -a -X --parsable2 -S 2025-01-01 -E 2025-04-01 \\
          --format=JobID,JobName,Account,QOS,Submit,Start,End,NNodes,AllocTRES > sacct.txt
    python -m airflow_gpu.sim.export slurm sacct.txt -o jobs.csv

What a job is, per source (docs/replay-traces.md):
- Kueue Workload: one job; team = its namespace (mapped to the quota file's team of that namespace),
  tier = spec.priorityClassName (`airflow-gpu-<tier>` reads as <tier>); workers = the pods of the
  podSets that ask GPUs (nvidia.com/gpu, or MIG slices as sevenths of one: gpu_milli; requests else
  limits), gpus_per_worker = the largest ask among them; duration = the Finished condition's time - the
  Admitted (else QuotaReserved, else PodsReady) condition's; submit = creationTimestamp. Workloads not
  finished are left out (counted on stderr).
- Slurm allocation (sacct -X: one row per job, no steps): team = Account, tier = QOS; workers =
  NNodes, gpus_per_worker = the gres/gpu count of AllocTRES / NNodes, cpu and mem of AllocTRES / NNodes;
  products = the gres type (gres/gpu:a100=8) with --gpu-types only; duration = End - Start; submit = Submit. Jobs without GPUs or that never
  started are left out; a JobID listed again (requeued, sacct -D) keeps its last run.
Times become seconds since the earliest submit. Jobs are written as not checkpointable: neither
source records it; edit the column for jobs that checkpoint.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from collections import Counter
from pathlib import Path

import yaml

from airflow_gpu import constants as C
from airflow_gpu.config.core import mig_gpus
from airflow_gpu.kube.wire import ConversionError, parse_time
from airflow_gpu.sim.traces import text_encoding

COLUMNS = ("job", "submit_time", "duration", "workers", "gpus_per_worker", "gpu_milli", "cpu_milli", "memory_mib",
           "team", "tier", "products", "checkpointable")


class ExportError(ValueError):
    """The input is not what the exporter reads; the message names the record and the field."""


def _quantity(value) -> float:
    """A Kubernetes quantity -> a number (cpu '500m' -> 0.5, memory '16Gi' -> bytes)."""
    s = str(value).strip()
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
             "Ti": 2**40}
    for suffix in sorted(units, key=len, reverse=True):
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * units[suffix]
    return float(s)


def _row(job, submit, duration, workers, gpus: float, cpu_milli, memory_mib, team, tier, products=()) -> dict:
    """One job; `gpus` per worker: whole GPUs from one up (a fraction above one rounded up), a share
    of one GPU (gpu_milli) below, which names no product (a MIG slice's type is not a model)."""
    whole, milli = (math.ceil(gpus - 1e-9), "") if gpus >= 1 else ("", max(1, round(gpus * 1000)))
    return {"job": job, "submit_time": submit, "duration": duration, "workers": workers, "gpus_per_worker": whole,
            "gpu_milli": milli, "cpu_milli": cpu_milli, "memory_mib": memory_mib, "team": team, "tier": tier,
            "products": "|".join(products) if whole else "", "checkpointable": "false"}


def _time(value, where: str) -> float | None:
    """The one RFC 3339 parser (kube.wire); Slurm's times without a zone read as UTC (only differences count)."""
    value = str(value or "").strip()
    if value in ("", "Unknown", "None"):
        return None
    try:
        return parse_time(value)
    except ConversionError as exc:
        raise ExportError(f"{where}: {exc}") from None


def _condition_time(wl: dict, kind: str, name: str) -> float | None:
    for c in (wl.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return _time(c.get("lastTransitionTime"), f"workload {name}: condition {kind}: lastTransitionTime")
    return None


def _gpu_ask(asked: dict) -> float:
    """GPUs a container asks: nvidia.com/gpu, or its MIG instances as the share of one GPU the
    scheduler counts them for (config.core.mig_gpus: nvidia.com/mig-3g.40gb is three sevenths)."""
    gpus = _quantity(asked.get(C.RESOURCE_GPU, 0))
    for resource, value in asked.items():
        if resource.startswith(C.RESOURCE_MIG_PREFIX):
            gpus += mig_gpus(resource[len(C.RESOURCE_MIG_PREFIX):]) * _quantity(value)
    return gpus


def kueue_rows(doc: dict, skipped: Counter, notes: Counter | None = None) -> list[dict]:
    """Workloads -> rows; `skipped`: why some were left out; `notes`: how some were approximated."""
    notes = Counter() if notes is None else notes
    items = doc.get("items") if isinstance(doc, dict) else None
    if items is None:
        raise ExportError("not a Workload list: expected the output of `kubectl get workloads -A -o json` "
                          "(an object with items)")
    rows = []
    for i, wl in enumerate(items):
        meta = wl.get("metadata") or {}
        name = f"{meta.get('namespace', '')}/{meta.get('name', f'item{i}')}"
        finished = _condition_time(wl, "Finished", name)
        # Kueue 0.15 before its revert (kueue#8599) set Admitted and QuotaReserved False on finishing,
        # losing the admission time; PodsReady (all pods started) still says when it ran
        admitted = (_condition_time(wl, "Admitted", name) or _condition_time(wl, "QuotaReserved", name)
                    or _condition_time(wl, "PodsReady", name))
        if finished is None:
            skipped["not finished (pending, running or deleted)"] += 1
            continue
        if admitted is None:
            skipped["finished without an Admitted, QuotaReserved or PodsReady time"] += 1
            continue
        created = _time(meta.get("creationTimestamp"), f"workload {name}: metadata.creationTimestamp")
        if created is None:
            raise ExportError(f"workload {name}: no metadata.creationTimestamp")
        workers = gpus = cpu = mem = 0
        shapes = set()
        for ps in (wl.get("spec") or {}).get("podSets") or []:
            count = int(ps.get("count", 1))
            pod_gpus = pod_cpu = pod_mem = 0.0
            for c in ((ps.get("template") or {}).get("spec") or {}).get("containers") or []:
                res = c.get("resources") or {}
                asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}
                try:
                    pod_gpus += _gpu_ask(asked)
                    pod_cpu += _quantity(asked.get("cpu", 0))
                    pod_mem += _quantity(asked.get("memory", 0))
                except ValueError:
                    raise ExportError(f"workload {name}: podSet {ps.get('name')!r}: a resource quantity is not "
                                      f"a number: {asked}") from None
            if pod_gpus > 0:
                workers += count
                shapes.add(pod_gpus)
                if pod_gpus >= gpus:
                    gpus, cpu, mem = pod_gpus, pod_cpu, pod_mem
        if not workers:
            skipped["no GPU"] += 1
            continue
        if len(shapes) > 1:  # one worker shape per job in the format: the largest, so it fits where it ran
            notes["with podSets of different GPU asks, written as that many workers of the largest ask"] += 1
        if gpus % 1 and gpus > 1:
            notes["asking a fraction of a GPU above one, rounded up to whole GPUs"] += 1
        spec = wl.get("spec") or {}
        rows.append(_row(name, created, max(1.0, finished - admitted), workers, gpus,
                         int(cpu * 1000), int(mem / 2**20), meta.get("namespace", ""),
                         spec.get("priorityClassName") or ""))
    return rows


_TRES_GPU = re.compile(r"gres/gpu(?::([^=,]+))?=(\d+)")
_SLURM_MIG = re.compile(r"(?:^|_)(\d+g\.\d+gb)$")  # the MIG profile of a gres type: 1g.10gb, a100_3g.40gb
_TRES_CPU = re.compile(r"(?:^|,)cpu=(\d+)")
_TRES_MEM = re.compile(r"(?:^|,)mem=([\d.]+)([KMGT]?)")
_SLURM_MIB = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2}  # Slurm's units are binary


def slurm_rows(text: str, skipped: Counter, gpu_types: bool = False, notes: Counter | None = None) -> list[dict]:
    """sacct --parsable2 output -> rows; `skipped`: why some were left out; `notes`: how some were
    approximated. A JobID listed again (requeued, with -D) keeps its last run."""
    notes = Counter() if notes is None else notes
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ExportError("empty sacct output")
    header = lines[0].split("|")
    need = ("JobID", "Account", "QOS", "Submit", "Start", "End", "NNodes", "AllocTRES")
    missing = [f for f in need if f not in header]
    if missing:
        raise ExportError(f"sacct output lacks field(s) {', '.join(missing)}: run sacct --parsable2 "
                          f"--format={','.join(need)} (first line must be the header)")
    rows: dict[str, dict] = {}
    for n, line in enumerate(lines[1:], start=2):
        rec = dict(zip(header, line.split("|")))
        job = rec["JobID"]
        if "." in job:  # a step: -X was not given; its allocation row is the job
            skipped["job steps"] += 1
            continue
        submit, start, end = (_time(rec[f], f"line {n}: sacct job {job}: field {f}") for f in ("Submit", "Start", "End"))
        if submit is None or start is None or end is None:
            skipped["never started or still running"] += 1
            continue
        tres = {}
        for product, count in _TRES_GPU.findall(rec["AllocTRES"]):
            tres[product] = tres.get(product, 0) + int(count)
        typed = {p: c for p, c in tres.items() if p}
        gpus = sum(typed.values()) if typed else tres.get("", 0)
        if not gpus:
            skipped["no GPU"] += 1
            continue
        try:
            nodes = max(1, int(rec["NNodes"]))
        except ValueError:
            raise ExportError(f"line {n}: sacct job {job}: field NNodes must be an integer, got {rec['NNodes']!r}") from None
        if gpus % nodes:  # one worker shape per job in the format: the most any node had
            notes["with GPUs not even over their nodes, written as the most per node"] += 1
        cpu, mem = _TRES_CPU.search(rec["AllocTRES"]), _TRES_MEM.search(rec["AllocTRES"])
        mem_mib = float(mem.group(1)) * _SLURM_MIB[mem.group(2) or "M"] if mem else 0.0
        if job in rows:
            notes["listed again (requeued, sacct -D), kept as their last run"] += 1
            del rows[job]  # the last run, in its own place in submit order
        per_node = -(-gpus // nodes)
        slices = [(_SLURM_MIG.search(t), c) for t, c in typed.items()]
        if slices and all(m for m, _ in slices):  # MIG slices (gres/gpu:1g.10gb=1): sevenths of one GPU
            per_node = sum(mig_gpus(m.group(1)) * c for m, c in slices) / nodes
        rows[job] = _row(job, submit, max(1.0, end - start), nodes, per_node,
                         int(cpu.group(1)) * 1000 // nodes if cpu else 0, int(mem_mib // nodes),
                         rec["Account"], rec["QOS"], tuple(sorted(typed)) if gpu_types else ())
    return list(rows.values())


def write(rows: list[dict], out) -> None:
    """Times to seconds since the earliest submit; rows in submit order."""
    origin = min((r["submit_time"] for r in rows), default=None)
    writer = csv.DictWriter(out, fieldnames=COLUMNS)
    writer.writeheader()
    for r in sorted(rows, key=lambda r: (r["submit_time"], r["job"])):
        writer.writerow({**r, "submit_time": f"{r['submit_time'] - origin:g}",
                         "duration": f"{r['duration']:g}"})


def _text(raw: bytes) -> str:
    try:
        return raw.decode(text_encoding(raw[:2]))
    except UnicodeDecodeError as exc:
        raise ExportError(f"not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None


def _document(text: str) -> dict:
    """`kubectl get workloads -A -o json` or `-o yaml` output."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:
            doc = None
        if not isinstance(doc, dict):
            raise ExportError(f"neither JSON ({exc}) nor a YAML document; give `kubectl get workloads -A -o json` "
                              "output") from None
        return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m airflow_gpu.sim.export",
                                 description="cluster history -> the generic job CSV of `simulate replay --trace`")
    ap.add_argument("source", choices=("kueue", "slurm"))
    ap.add_argument("file", type=Path, help="kubectl get workloads -A -o json output, or sacct --parsable2 output")
    ap.add_argument("-o", "--output", type=Path, help="CSV to write (default: stdout)")
    ap.add_argument("--gpu-types", action="store_true",
                    help="slurm: write the gres type (gres/gpu:a100=8 -> products a100); only when the node list's "
                         "model column uses the same names, else those jobs fit nowhere")
    args = ap.parse_args(argv)
    skipped: Counter = Counter()
    notes: Counter = Counter()
    try:
        text = _text(args.file.read_bytes())
        if args.source == "kueue":
            rows = kueue_rows(_document(text), skipped, notes)
        else:
            rows = slurm_rows(text, skipped, args.gpu_types, notes)
    except (OSError, ExportError) as exc:
        print(f"{args.file}: {exc}", file=sys.stderr)
        return 2
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        with args.output.open("w", newline="") as fh:
            write(rows, fh)
    else:
        write(rows, sys.stdout)
    left = ", ".join(f"{n} {why}" for why, n in sorted(skipped.items()))
    print(f"{len(rows)} job{'s' if len(rows) != 1 else ''} exported" + (f"; left out: {left}" if left else ""), file=sys.stderr)
    for why, n in sorted(notes.items()):
        print(f"  {n} job{'s' if n != 1 else ''} {why}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
