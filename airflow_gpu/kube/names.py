"""Deterministic, bounded names and label values for the objects of one gang.

Kubernetes limits: a Service name is an RFC 1035 label (<= 63, starts with a letter), a pod's
hostname an RFC 1123 label (<= 63), a label value <= 63 characters of [A-Za-z0-9-_.] beginning and
ending alphanumeric. Airflow ids are longer and freer (run ids carry ':' and '+'), so every name
keeps a readable prefix and, when it had to be shortened or cleaned, a hash of the exact value:
the same input always gives the same name, different inputs practically never collide.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass

from airflow_gpu import constants as C

MAX_LABEL = 63
MAX_RANK_DIGITS = 5  # pods are <gang>-<rank>; ranks up to 99999
MAX_GANG_NAME = MAX_LABEL - 1 - MAX_RANK_DIGITS
HASH_CHARS = 10

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_NOT_DNS = re.compile(r"[^a-z0-9-]+")
_NOT_LABEL = re.compile(r"[^A-Za-z0-9_.-]+")


def digest(*parts: object) -> str:
    """A short stable hash of the parts (their JSON form, so ("a-b", "c") != ("a", "b-c"))."""
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:HASH_CHARS]


def is_dns_label(name: str, limit: int = MAX_LABEL) -> bool:
    return len(name) <= limit and bool(_DNS_LABEL.match(name))


def label_value(value: str) -> str:
    """`value` if Kubernetes accepts it as a label value, else a cleaned prefix plus a hash of it."""
    if len(value) <= MAX_LABEL and _LABEL_VALUE.match(value):
        return value
    cleaned = _NOT_LABEL.sub("-", value).strip("-_.")[: MAX_LABEL - HASH_CHARS - 1].rstrip("-_.")
    return f"{cleaned}-{digest(value)}" if cleaned else digest(value)


def dns_slug(text: str, limit: int) -> str:
    """Lowercase letters, digits and single '-', starting with a letter, at most `limit` long."""
    slug = re.sub(r"-{2,}", "-", _NOT_DNS.sub("-", text.lower())).strip("-")
    if not slug or not slug[0].isalpha():
        slug = f"g-{slug}".rstrip("-")
    return slug[:limit].rstrip("-")


@dataclass(frozen=True)
class TaskInstanceRef:
    """The Airflow task instance a gang runs for: exact ids (labels carry their label-safe forms)."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1
    try_number: int = 1

    def __post_init__(self) -> None:
        for field_name in ("dag_id", "task_id", "run_id"):
            if not getattr(self, field_name):
                raise ValueError(f"task instance {field_name} is empty: give the Airflow {field_name}")
        if self.map_index < -1:
            raise ValueError(f"task instance map_index={self.map_index}: must be -1 (not mapped) or >= 0")
        if self.try_number < 0:
            raise ValueError(f"task instance try_number={self.try_number}: must be >= 0")

    def labels(self, with_try: bool = True) -> dict[str, str]:
        """Labels that find every object of this task instance (all tries with with_try=False)."""
        out = {
            C.LABEL_DAG_ID: label_value(self.dag_id),
            C.LABEL_TASK_ID: label_value(self.task_id),
            C.LABEL_RUN_ID: label_value(self.run_id),
        }
        if self.map_index >= 0:  # as KubernetesPodOperator does: no map-index label on unmapped tasks
            out[C.LABEL_MAP_INDEX] = str(self.map_index)
        if with_try:
            out[C.LABEL_TRY_NUMBER] = str(self.try_number)
        return out

    def selector(self, with_try: bool = False) -> str:
        """A label selector for the objects of this task instance (every try by default)."""
        labels = {C.LABEL_MANAGED_BY: C.MANAGED_BY_VALUE, **self.labels(with_try)}
        return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))

    def annotation(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))


def gang_name(ti: TaskInstanceRef, attempt: int) -> str:
    """The name of the gang (PodGroup, Service; pods are <name>-<rank>) of one attempt of a task
    instance: '<dag>-<task>[-<map index>]-a<attempt>-<hash>', bounded so that pod names fit in 63."""
    suffix = f"-a{attempt}-{digest(ti.dag_id, ti.task_id, ti.run_id, ti.map_index, attempt)}"
    readable = f"{ti.dag_id}-{ti.task_id}" + (f"-{ti.map_index}" if ti.map_index >= 0 else "")
    return dns_slug(readable, MAX_GANG_NAME - len(suffix)) + suffix


def member_name(gang: str, rank: int) -> str:
    """Pod name (and hostname) of a gang member."""
    return f"{gang}-{rank}"
