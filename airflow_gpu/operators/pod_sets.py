"""GpuTrainingOperator(pod_sets=[...]): a launcher and its workers from a DAG (an MPI launcher on CPU,
a torchrun rendezvous pod, a parameter server), kept apart from the operator's other arguments.

Each set: `name`, `replicas`, `gpus` per pod or one `mig_profile` slice per pod or neither (CPU-only),
and its own `image` / `cmds` / `arguments` / `env_vars` / `container_resources` (left out: the
operator's). A dict per set, or `PodSetSpec` (kube/spec.py: the one home of the shape). Checked when
the DAG file is parsed, like workers / gpus_per_worker: the structure (kube.spec), then the GPUs of
every set and of all sets together against the team's quota (config.workload.plan_pod_set_task);
errors name the field, e.g. `pod_sets[1].replicas`. Exclusive with workers / gpus_per_worker /
mig_profile. The pods' env: kube.manifests.pod_set_env.
"""

from __future__ import annotations

import re
from typing import Any

from airflow_gpu.operators.arguments import ArgumentProblem

EXCLUSIVE = ("workers", "gpus_per_worker", "mig_profile")
_FIELD = re.compile(r"^(pod_sets(\[\d+\](\.[a-z_]+)?)?)")


def pod_sets_conflict(workers, gpus_per_worker, mig_profile) -> ArgumentProblem | None:
    """pod_sets decides the pods and their GPUs: the single-set arguments may not be given too."""
    given = [n for n, v in zip(EXCLUSIVE, (workers, gpus_per_worker, mig_profile)) if v is not None]
    if given:
        return ArgumentProblem("pod_sets", f"give pod_sets (replicas and gpus or mig_profile per set) or "
                                           f"{' / '.join(EXCLUSIVE)}, not both (got {', '.join(given)})")
    return None


def parse_pod_sets(value: Any) -> tuple:
    """The author's pod sets (dicts or PodSetSpec) as PodSetSpec, checked; ArgumentProblem naming the
    field (pod_sets[i].replicas ...) otherwise."""
    from airflow_gpu.kube.spec import PodSetSpec, WorkloadSpecError

    if isinstance(value, (str, bytes, dict)) or not isinstance(value, (list, tuple)) or not value:
        raise ArgumentProblem("pod_sets", "give a non-empty list of pod sets, e.g. [{'name': 'launcher'}, "
                                          "{'name': 'worker', 'replicas': 2, 'gpus': 8}]")
    sets = []
    for i, item in enumerate(value):
        try:
            ps = PodSetSpec.of(item)
            ps.check(f"pod_sets[{i}]")
        except (WorkloadSpecError, TypeError) as exc:
            text = str(exc)
            if not text.startswith("pod_sets"):
                text = f"pod_sets[{i}]" + (text if text.startswith((".", ":")) else f": {text}")
            field = _FIELD.match(text).group(1)
            rest = text[len(field):]
            raise ArgumentProblem(field, rest[1:].strip() if rest.startswith(":") else text) from None
        if ps.name in [s.name for s in sets]:
            raise ArgumentProblem(f"pod_sets[{i}].name", f"two pod sets are named {ps.name!r}")
        sets.append(ps)
    return tuple(sets)


def gang_gpus(spec, cfg) -> float:
    """GPUs of a gang of pod sets (a MIG slice by its share of a GPU, config.core.mig_gpus)."""
    from airflow_gpu.config.core import mig_gpus

    return float(sum(ps.replicas * (ps.gpus or (mig_gpus(ps.mig_profile, cfg, spec.gpu_products)
                                                 if ps.mig_profile else 0)) for ps in spec.pod_sets))


def describe(pod_sets) -> str:
    """'launcher 1 x CPU + worker 2 x 8 GPU' for the task log."""
    return " + ".join(f"{ps.name} {ps.replicas} x " + (f"{ps.gpus} GPU" if ps.gpus else ps.mig_profile or "CPU")
                      for ps in pod_sets)


__all__ = ["describe", "gang_gpus", "parse_pod_sets", "pod_sets_conflict"]
