"""GpuTrainingOperator: a gang of W training pods x G GPUs (or one MIG slice each) from a DAG task.

Every argument is checked when the DAG file is parsed, against the quota configuration (loaded once
per process): a bad one raises `GpuTaskArgumentError` naming the argument and the fix, and the DAG
shows an import error instead of failing at run time. The author never repeats what the config
decides: pool, pool_slots, priority_weight (weight_rule "absolute"), PriorityClass and capacity type
are derived from team and tier (`airflow_gpu.config.workload`, `airflow_gpu.core.capacity`).

Parsing stays cheap: this module imports no Kubernetes client, provider hook or trigger; execute()
does.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator

from airflow_gpu import constants
from airflow_gpu.checkpoint.backends import uri_problem
from airflow_gpu.config import ConfigError, load_config_cached
from airflow_gpu.config.workload import GpuTaskPlan, WorkloadError, plan_gpu_task
from airflow_gpu.core.capacity import choose_capacity, spot_request_problem
from airflow_gpu.pools.plan import pool_name

CONFIG_SECTION = "airflow_gpu"
CONFIG_OPTION = "config_file"  # [airflow_gpu] config_file, env AIRFLOW__AIRFLOW_GPU__CONFIG_FILE
TOPOLOGIES = ("node", "clique", "rack", "zone")
GANG_BACKENDS = ("airflow-gpu", "coscheduling", "volcano", "kueue")
DERIVED = ("pool", "pool_slots", "priority_weight", "weight_rule")
RESOURCE_KINDS = ("requests", "limits")
CONTAINER_RESOURCES = ("cpu", "memory", "ephemeral-storage")


class GpuTaskArgumentError(ValueError):
    """A GpuTrainingOperator argument is wrong: raised at DAG parse time, naming the argument."""

    def __init__(self, task_id: str, argument: str, message: str):
        self.argument = argument
        super().__init__(f"GpuTrainingOperator(task_id={task_id!r}) argument {argument!r}: {message}")


def resolve_config_file(config_file: str | None) -> str | None:
    """The operator's `config_file`, else Airflow's `[airflow_gpu] config_file` (which also reads the
    env var AIRFLOW__AIRFLOW_GPU__CONFIG_FILE)."""
    if config_file:
        return config_file
    env = os.environ.get(f"AIRFLOW__{CONFIG_SECTION.upper()}__{CONFIG_OPTION.upper()}")
    if env:
        return env
    from airflow.configuration import conf  # already imported by the DAG processor

    return conf.get(CONFIG_SECTION, CONFIG_OPTION, fallback=None) or None


class GpuTrainingOperator(BaseOperator):
    """Gang-scheduled training on the airflow-gpu scheduler; see the module docstring and README."""

    template_fields: Sequence[str] = ("image", "cmds", "arguments", "env_vars", "labels", "annotations",
                                      "checkpoint")
    ui_color = "#76b900"

    def __init__(
        self,
        *,
        team: str,
        tier: str,
        image: str,
        workers: int = 1,
        gpus_per_worker: int | None = None,
        mig_profile: str | None = None,
        gpu_products: Sequence[str] | None = None,
        checkpoint: str | None = None,
        spot: str = "auto",
        max_interruptions: int = 3,
        deadline: dt.datetime | dt.timedelta | None = None,
        cmds: Sequence[str] | None = None,
        arguments: Sequence[str] | None = None,
        env_vars: Mapping[str, str] | None = None,
        secrets: Sequence[Any] | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        volumes: Sequence[Any] | None = None,
        volume_mounts: Sequence[Any] | None = None,
        node_selector: Mapping[str, str] | None = None,
        tolerations: Sequence[Any] | None = None,
        service_account_name: str | None = None,
        termination_grace_period: int | None = None,
        container_resources: Mapping[str, Mapping[str, str]] | None = None,
        topology: str | None = None,
        topology_required: bool = False,
        gang_backend: str = "airflow-gpu",
        kubernetes_conn_id: str = "kubernetes_default",
        namespace: str | None = None,
        config_file: str | None = None,
        deferrable: bool = True,
        poll_interval: float = 10.0,
        **kwargs: Any,
    ) -> None:
        task_id = kwargs.get("task_id", "?")

        def bad(argument: str, message: str) -> GpuTaskArgumentError:
            return GpuTaskArgumentError(task_id, argument, message)

        for name in DERIVED:
            if name in kwargs:
                raise bad(name, "is derived from team and tier (the team's pool for the tier class, the GPU "
                                "demand in 1/7-GPU slots, the tier's priority); remove it")
        path = resolve_config_file(config_file)
        if not path:
            raise bad("config_file", f"no quota configuration: pass config_file=... or set [{CONFIG_SECTION}] "
                                     f"{CONFIG_OPTION} (env AIRFLOW__{CONFIG_SECTION.upper()}__{CONFIG_OPTION.upper()})")
        try:
            cfg = load_config_cached(path)
        except ConfigError as exc:
            raise bad("config_file", str(exc)) from None
        try:
            plan = plan_gpu_task(cfg, team=team, tier=tier, workers=workers, gpus_per_worker=gpus_per_worker,
                                 mig_profile=mig_profile,
                                 gpu_products=list(gpu_products) if isinstance(gpu_products, (list, tuple)) else gpu_products)
        except WorkloadError as exc:
            raise bad(exc.argument, str(exc).split(": ", 1)[1]) from None

        super().__init__(
            pool=pool_name(plan.team.name, plan.tier_class),
            pool_slots=plan.pool_slots,
            priority_weight=plan.priority,
            weight_rule="absolute",
            **kwargs,
        )

        if checkpoint is not None:
            problem = uri_problem(checkpoint)
            if problem:
                raise bad("checkpoint", f"{problem}; it is the URI prefix under which each task instance "
                                        "keeps its checkpoints")
        problem = spot_request_problem(spot, checkpointable=checkpoint is not None, retriable=self.retries > 0)
        if problem:
            raise bad(*problem)
        if isinstance(max_interruptions, bool) or not isinstance(max_interruptions, int) or max_interruptions < 0:
            raise bad("max_interruptions", f"must be a whole number >= 0 (got {max_interruptions!r})")
        if deadline is not None:
            if isinstance(deadline, dt.timedelta):
                if deadline <= dt.timedelta(0):
                    raise bad("deadline", f"must be a positive duration after the task starts (got {deadline})")
            elif isinstance(deadline, dt.datetime):
                if deadline.tzinfo is None:
                    raise bad("deadline", "must be timezone-aware (e.g. pendulum.datetime(..., tz='UTC'))")
            else:
                raise bad("deadline", f"must be a datetime or a timedelta (got {type(deadline).__name__})")
        if not isinstance(image, str) or not image.strip():
            raise bad("image", f"must be a container image name (got {image!r})")
        if topology is not None and topology not in TOPOLOGIES:
            raise bad("topology", f"must be one of {', '.join(TOPOLOGIES)} or None (got {topology!r})")
        if not isinstance(topology_required, bool):
            raise bad("topology_required", f"must be True or False (got {topology_required!r})")
        if gang_backend not in GANG_BACKENDS:
            raise bad("gang_backend", f"must be one of {', '.join(GANG_BACKENDS)} (got {gang_backend!r})")
        if termination_grace_period is not None and (
                isinstance(termination_grace_period, bool) or not isinstance(termination_grace_period, int)
                or termination_grace_period < 0):
            raise bad("termination_grace_period",
                      f"must be whole seconds >= 0: the time training has to checkpoint after SIGTERM "
                      f"(got {termination_grace_period!r})")
        if not isinstance(poll_interval, (int, float)) or isinstance(poll_interval, bool) or poll_interval <= 0:
            raise bad("poll_interval", f"must be a number of seconds > 0 (got {poll_interval!r})")
        _check_resources(bad, container_resources)
        for argument, value in (("labels", labels), ("annotations", annotations)):
            for key in value or {}:
                if str(key).startswith(constants.DOMAIN + "/"):
                    raise bad(argument, f"{key!r}: keys under {constants.DOMAIN}/ are set by the operator; "
                                        "use your own prefix")
        if namespace is not None and namespace != plan.namespace:
            raise bad("namespace", f"team {plan.team.name!r} runs in namespace {plan.namespace!r} (its quota and "
                                   "pools are there); leave namespace out")

        self.team = plan.team.name
        self.tier = plan.tier.name
        self.workers = plan.workers
        self.gpus_per_worker = gpus_per_worker
        self.mig_profile = mig_profile
        self.gpu_products = list(plan.products)
        self.checkpoint = checkpoint
        self.spot = spot
        self.max_interruptions = max_interruptions
        self.deadline = deadline
        self.image = image
        self.cmds = list(cmds) if cmds is not None else None
        self.arguments = list(arguments) if arguments is not None else None
        self.env_vars = dict(env_vars or {})
        self.secrets = list(secrets or [])
        self.labels = dict(labels or {})
        self.annotations = dict(annotations or {})
        self.volumes = list(volumes or [])
        self.volume_mounts = list(volume_mounts or [])
        self.node_selector = dict(node_selector or {})
        self.tolerations = list(tolerations or [])
        self.service_account_name = service_account_name
        self.termination_grace_period = termination_grace_period
        self.container_resources = {k: dict(v) for k, v in (container_resources or {}).items()}
        self.topology = topology
        self.topology_required = topology_required
        self.gang_backend = gang_backend
        self.kubernetes_conn_id = kubernetes_conn_id
        self.namespace = plan.namespace
        self.config_file = path
        self.deferrable = deferrable
        self.poll_interval = float(poll_interval)
        self.priority_class = plan.priority_class
        self.tier_class = plan.tier_class

    # -- derived values, recomputed from the (cached) config where they decide -------------------

    def gpu_plan(self) -> GpuTaskPlan:
        return plan_gpu_task(load_config_cached(self.config_file), team=self.team, tier=self.tier,
                             workers=self.workers, gpus_per_worker=self.gpus_per_worker,
                             mig_profile=self.mig_profile, gpu_products=self.gpu_products)

    def capacity_for(self, interruptions: int = 0, try_number: int = 1, seconds_to_deadline: float | None = None,
                     seconds_run: float = 0.0):
        """Spot or on-demand for the next launch: core.capacity decides."""
        cfg = load_config_cached(self.config_file)
        return choose_capacity(
            self.spot, tier_allows_spot=cfg.tier(self.tier).spot_eligible, checkpointable=self.checkpoint is not None,
            retriable=self.retries > 0, interruptions=interruptions, max_interruptions=self.max_interruptions,
            last_try=try_number > self.retries, seconds_to_deadline=seconds_to_deadline, seconds_run=seconds_run)

    def execute(self, context):
        raise NotImplementedError("GpuTrainingOperator.execute lands with the kube/ package (issue 11 §4)")


def _check_resources(bad, resources) -> None:
    if resources is None:
        return
    if not isinstance(resources, Mapping):
        raise bad("container_resources", f"must be a mapping like {{'requests': {{'cpu': '4', 'memory': '16Gi'}}}} "
                                         f"(got {type(resources).__name__})")
    for kind, values in resources.items():
        if kind not in RESOURCE_KINDS:
            raise bad("container_resources", f"unknown key {kind!r}; allowed: {', '.join(RESOURCE_KINDS)}")
        if not isinstance(values, Mapping):
            raise bad("container_resources", f"{kind} must be a mapping of resource -> quantity (got {values!r})")
        for name in values:
            if name not in CONTAINER_RESOURCES:
                hint = (" GPUs come from gpus_per_worker / mig_profile" if "gpu" in str(name) or "mig" in str(name)
                        else "")
                raise bad("container_resources", f"{kind}.{name}: only {', '.join(CONTAINER_RESOURCES)} may be set "
                                                 f"here;{hint or ' other resources are not per-container asks'}")
