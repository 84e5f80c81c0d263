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

import contextvars
import datetime as dt
import functools
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException  # loaded with airflow.sdk

from airflow_gpu import constants as C
from airflow_gpu.checkpoint.storage.base import uri_problem
from airflow_gpu.config import ConfigError, load_config_cached
from airflow_gpu.config.workload import GpuTaskPlan, WorkloadError, plan_gpu_task, plan_pod_set_task
from airflow_gpu.core.capacity import choose_capacity, spot_request_problem
from airflow_gpu.core.chargeback import CAPACITY_UNKNOWN, CAUSE_INTERRUPTION, CAUSE_PREEMPTION, CAUSE_RESTART
from airflow_gpu.core.model import gpu_seconds_lost, restart_lost_gpu_seconds
from airflow_gpu.core.tiers import restart_overhead_of
from airflow_gpu.kube.outcome import LOST_GPU_SECONDS_KEYS, USAGE_BY_CAPACITY
from airflow_gpu.operators.gang_logs import (ResultError, application_failure, argument_problems, delete_expired_kept,
                                             disruptions_note, is_kept, keep_ended_pods, keeps, log_ranks, result_of)
from airflow_gpu.pools.plan import pool_name

CONFIG_SECTION = "airflow_gpu"
CONFIG_OPTION = "config_file"  # [airflow_gpu] config_file, env AIRFLOW__AIRFLOW_GPU__CONFIG_FILE
CAPACITY_LABELS_OPTION = "capacity_labels"  # [airflow_gpu] capacity_labels: karpenter | eks | gke
SETTLE_OPTION = "deferral_settle_seconds"  # [airflow_gpu] deferral_settle_seconds (triggers/gang.py)
SCHEDULER_NAMESPACE_OPTION = "scheduler_namespace"  # [airflow_gpu] scheduler_namespace: where the scheduler records
DERIVED = ("pool", "pool_slots", "priority_weight", "weight_rule")
DERIVED_MESSAGE = ("is derived from team and tier (the team's pool for the tier class, the GPU demand in 1/7-GPU "
                   "slots, the tier's priority with weight_rule 'absolute'); remove it")
CONFIG_FILE_NOTE = ("; config_file is the airflow-gpu quota file (teams, tiers, quotas), not a kubeconfig as for "
                    "KubernetesPodOperator: the cluster comes from kubernetes_conn_id")
STATE_KEY = "airflow_gpu.gang"  # task_state_store key of the try's RunState
_SAFE_KEY = re.compile(r"[^A-Za-z0-9._=-]+")
_LEADING_NAME = re.compile(r"^[a-z_]+")


class GpuTaskArgumentError(ValueError):
    """A GpuTrainingOperator argument is wrong: raised at DAG parse time, naming the argument."""

    def __init__(self, task_id: str, argument: str, message: str):
        self.argument = argument
        self.detail = message
        super().__init__(f"GpuTrainingOperator(task_id={task_id!r}) argument {argument!r}: {message}")


class MappedTaskArgumentError(GpuTaskArgumentError, AirflowFailException):
    """GpuTaskArgumentError that is also Airflow's non-retryable failure: raised when a mapped task is
    unmapped at run time (its expand() values came from XCom, so they are checked only then); a
    deterministic error must not spend the task's retries."""


NO_RETRY_NOTE = " (an argument error: failing without spending a retry)"
_PARSE_CHECK = contextvars.ContextVar("gpu_training_parse_check", default=False)  # expand()'s literal check


def _argument_errors_fail_mapped_tasks(init):
    """__init__ of a task unmapped at run time (expand() over XCom values): its argument errors fail
    the task without spending a retry, as the run-time checks after rendering do."""
    @functools.wraps(init)
    def wrapper(self, **kwargs):
        try:
            return init(self, **kwargs)
        except GpuTaskArgumentError as exc:
            if not getattr(self, "_BaseOperator__from_mapped", False) or _PARSE_CHECK.get():
                raise
            raise MappedTaskArgumentError(kwargs.get("task_id", "?"), exc.argument, exc.detail + NO_RETRY_NOTE) from None
    return wrapper


def resolve_config_file(config_file: str | None) -> str | None:
    """The operator's `config_file`, else Airflow's `[airflow_gpu] config_file` (which also reads the
    env var AIRFLOW__AIRFLOW_GPU__CONFIG_FILE)."""
    return config_file or _setting(CONFIG_OPTION)


def _setting(option: str) -> str | None:
    """An `[airflow_gpu]` option: its env var first (cheap at parse time), then airflow.cfg."""
    env = os.environ.get(f"AIRFLOW__{CONFIG_SECTION.upper()}__{option.upper()}")
    if env:
        return env
    from airflow.configuration import conf  # already imported by the DAG processor

    return conf.get(CONFIG_SECTION, option, fallback=None) or None


def capacity_labels_setting() -> str:
    """Which cloud's node labels select spot / on-demand for the gang's pods (kube.spec.CAPACITY_LABELS):
    `[airflow_gpu] capacity_labels`, default karpenter. One value per Airflow deployment: it follows
    the cluster, not the DAG."""
    return _setting(CAPACITY_LABELS_OPTION) or "karpenter"


def scheduler_namespace_setting() -> str:
    """`[airflow_gpu] scheduler_namespace`: the GPU scheduler's own namespace (deploy/ installs it in
    airflow-gpu-system), where it records the pods it preempted; the workers and triggerer read that
    one ConfigMap (deploy/README.md, RBAC for the Airflow side)."""
    return _setting(SCHEDULER_NAMESPACE_OPTION) or C.DEFAULT_SCHEDULER_NAMESPACE


def deferral_settle_setting() -> float:
    """`[airflow_gpu] deferral_settle_seconds`: how long GangTrigger holds an event after the deferral
    (triggers/gang.py says why); its default when unset. A bad value is an error naming the option."""
    from airflow_gpu.triggers.gang import default_settle_seconds, settle_problem

    raw = _setting(SETTLE_OPTION)
    if raw is None:
        return default_settle_seconds()
    try:
        value = float(raw)
    except ValueError:
        value = raw
    problem = settle_problem(value)
    if problem:
        raise ValueError(f"[{CONFIG_SECTION}] {SETTLE_OPTION} (env AIRFLOW__{CONFIG_SECTION.upper()}__"
                         f"{SETTLE_OPTION.upper()}): {problem}")
    return value


def plan_arguments(task_id: str, config_file, team, tier, workers, gpus_per_worker, mig_profile, gpu_products,
                   pod_sets=None):
    """(plan, config path, derived BaseOperator arguments) for the arguments that decide the pool, or
    GpuTaskArgumentError naming the bad one. `pod_sets`: parsed (operators/pod_sets.py), instead of
    workers / gpus_per_worker / mig_profile."""
    def bad(argument: str, message: str) -> GpuTaskArgumentError:
        return GpuTaskArgumentError(task_id, argument, message)

    path = resolve_config_file(config_file)
    if not path:
        raise bad("config_file", f"no quota configuration: pass config_file=... or set [{CONFIG_SECTION}] "
                                 f"{CONFIG_OPTION} (env AIRFLOW__{CONFIG_SECTION.upper()}__{CONFIG_OPTION.upper()})"
                                 f"{CONFIG_FILE_NOTE}")
    try:
        cfg = load_config_cached(path)
    except ConfigError as exc:
        raise bad("config_file", f"{exc}{CONFIG_FILE_NOTE}") from None
    products = list(gpu_products) if isinstance(gpu_products, (list, tuple)) else gpu_products
    try:
        if pod_sets:
            plan = plan_pod_set_task(cfg, team=team, tier=tier, pod_sets=pod_sets, gpu_products=products)
        else:
            plan = plan_gpu_task(cfg, team=team, tier=tier, workers=1 if workers is None else workers,
                                 gpus_per_worker=gpus_per_worker, mig_profile=mig_profile, gpu_products=products)
    except WorkloadError as exc:
        raise bad(exc.argument, str(exc).split(": ", 1)[1]) from None
    derived = {"pool": pool_name(plan.team.name, plan.tier_class), "pool_slots": plan.pool_slots,
               "priority_weight": plan.priority, "weight_rule": "absolute"}
    return plan, path, derived


class GpuTrainingOperator(BaseOperator):
    """Gang-scheduled training on the airflow-gpu scheduler; see the module docstring and README."""

    template_fields: Sequence[str] = ("image", "cmds", "arguments", "env_vars", "labels", "annotations",
                                      "checkpoint", "pod_template_file", "pod_template_dict", "env_from",
                                      "node_selector", "container_resources", "volumes", "volume_mounts")
    ui_color = "#76b900"

    @classmethod
    def partial(cls, **kwargs):
        """Dynamic task mapping: the pool, pool_slots and priority of every mapped task are decided here,
        when the DAG file is parsed (the scheduler needs them before any task is expanded), so the
        arguments that decide them go to partial(); the others may be expanded."""
        from airflow_gpu.operators.arguments import POOL_ARGUMENTS

        task_id = kwargs.get("task_id", "?")
        for name in DERIVED:
            if name in kwargs:
                raise GpuTaskArgumentError(task_id, name, DERIVED_MESSAGE)
        try:
            _, _, derived = plan_arguments(task_id, kwargs.get("config_file"), kwargs.get("team"), kwargs.get("tier"),
                                           kwargs.get("workers"), kwargs.get("gpus_per_worker"),
                                           kwargs.get("mig_profile"), kwargs.get("gpu_products"),
                                           pod_sets=_parsed_pod_sets(task_id, kwargs))
        except GpuTaskArgumentError as exc:
            raise GpuTaskArgumentError(task_id, exc.argument, str(exc).split(": ", 1)[1] + _MAPPED_HINT) from None
        partial = super().partial(**kwargs, **derived)
        partial.__class__ = _operator_partial_class()  # expand() refuses the pool-deciding arguments
        return partial

    @_argument_errors_fail_mapped_tasks
    def __init__(
        self,
        *,
        team: str,
        tier: str,
        image: str,
        workers: int | None = None,  # default 1; None tells "not given" from 1 (pod_sets excludes it)
        gpus_per_worker: int | None = None,
        mig_profile: str | None = None,
        pod_sets: Sequence[Any] | None = None,
        gpu_products: Sequence[str] | None = None,
        checkpoint: str | None = None,
        spot: str = "auto",
        max_interruptions: int = 3,
        deadline: dt.datetime | dt.timedelta | None = None,
        cmds: Sequence[str] | None = None,
        arguments: Sequence[str] | None = None,
        env_vars: Mapping[str, str] | Sequence[Any] | None = None,
        env_from: Sequence[Any] | None = None,
        secrets: Sequence[Any] | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        volumes: Sequence[Any] | None = None,
        volume_mounts: Sequence[Any] | None = None,
        node_selector: Mapping[str, str] | None = None,
        tolerations: Sequence[Any] | None = None,
        service_account_name: str | None = None,
        termination_grace_period: int | None = None,
        restart_overhead_seconds: int | None = None,
        checkpoint_seconds: int | None = None,
        container_resources: Any = None,
        topology: str | None = None,
        topology_required: bool = False,
        gang_backend: str = "airflow-gpu",
        kubernetes_conn_id: str = "kubernetes_default",
        namespace: str | None = None,
        config_file: str | None = None,
        deferrable: bool = True,
        poll_interval: float = 10.0,
        get_logs: bool = True,
        logging_interval: int | float | None = 30,
        log_tail_lines: int = 200,
        on_finish_action: str = "delete_pod",
        image_pull_secrets: Any = None,
        image_pull_policy: str | None = None,
        affinity: Any = None,
        security_context: Any = None,
        container_security_context: Any = None,
        init_containers: Sequence[Any] | None = None,
        schedule_timeout_seconds: int | None = None,
        startup_timeout_seconds: int | None = None,
        pod_template_file: str | None = None,
        pod_template_dict: Mapping[str, Any] | None = None,
        full_pod_spec: Any = None,
        skip_on_exit_code: int | Sequence[int] | None = None,
        base_container_name: str = "base",
        **kwargs: Any,
    ) -> None:
        from airflow_gpu.operators import arguments as A

        task_id = kwargs.get("task_id", "?")

        def bad(argument: str, message: str) -> GpuTaskArgumentError:
            return GpuTaskArgumentError(task_id, argument, message)

        sets = _parsed_pod_sets(task_id, {"pod_sets": pod_sets, "workers": workers, "gpus_per_worker": gpus_per_worker,
                                          "mig_profile": mig_profile})
        plan, path, derived = plan_arguments(task_id, config_file, team, tier, workers, gpus_per_worker, mig_profile,
                                             gpu_products, pod_sets=sets)
        # set by BaseOperator's apply_defaults for a task unmapped from partial()/expand()
        from_mapped = getattr(self, "_BaseOperator__from_mapped", False)
        for name, value in derived.items():
            # partial() puts the derived values into a mapped task's kwargs (checked equal: an expand()
            # over a pool-deciding argument would differ); an author's own value is refused, even equal
            if name in kwargs and (not from_mapped or kwargs.pop(name) != value):
                raise bad(name, DERIVED_MESSAGE + ("" if not from_mapped else _MAPPED_HINT))
        super().__init__(**derived, **kwargs)
        if not deferrable:
            raise bad("deferrable", "GpuTrainingOperator always defers while its gang waits and runs (no worker "
                                    "slot is held); remove deferrable=False")
        if gang_backend == C.GANG_BACKEND_KUEUE:
            raise bad("gang_backend", "'kueue' is not supported by GpuTrainingOperator (a Kueue LocalQueue is not "
                                      "part of the quota config); use airflow-gpu, coscheduling or volcano")
        if startup_timeout_seconds is not None and schedule_timeout_seconds is not None:
            raise bad("startup_timeout_seconds", "give schedule_timeout_seconds or startup_timeout_seconds (its KPO "
                                                 "name), not both")
        try:
            env_literal, self.env_sources = A.split_env(env_vars)
            secrets, self.secret_volumes = A.split_secrets(secrets)
            container_resources = A.resources_dict(container_resources)
            self.image_pull_secrets = A.image_pull_secrets_list(image_pull_secrets)
            self.skip_on_exit_code = A.exit_codes(skip_on_exit_code)
        except A.ArgumentProblem as exc:
            raise bad(exc.argument, exc.message) from None
        env_vars = env_literal
        self.env_from = list(env_from or [])
        self.image_pull_policy = image_pull_policy
        self.affinity = affinity
        self.security_context = security_context
        self.container_security_context = container_security_context
        self.init_containers = list(init_containers or [])
        self.schedule_timeout_seconds = schedule_timeout_seconds if startup_timeout_seconds is None \
            else startup_timeout_seconds
        self.pod_template_file = pod_template_file
        self.pod_template_dict = pod_template_dict
        self.full_pod_spec = full_pod_spec
        # KPO's name: the training container among the template's (sidecars'), the one whose logs, exit
        # code and termination message are the task's
        self.base_container_name = base_container_name

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
        if not isinstance(topology_required, bool):
            raise bad("topology_required", f"must be True or False (got {topology_required!r})")
        if not isinstance(poll_interval, (int, float)) or isinstance(poll_interval, bool) or poll_interval <= 0:
            raise bad("poll_interval", f"must be a number of seconds > 0 (got {poll_interval!r})")
        for problem in argument_problems(get_logs, logging_interval, log_tail_lines, on_finish_action):
            raise bad(*problem)
        if namespace is not None and namespace != plan.namespace:
            raise bad("namespace", f"team {plan.team.name!r} runs in namespace {plan.namespace!r} (its quota and "
                                   "pools are there); leave namespace out")

        self.team = plan.team.name
        self.tier = plan.tier.name
        self.workers = plan.workers
        self.gpus_per_worker = gpus_per_worker
        self.mig_profile = mig_profile
        self.pod_sets = sets
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
        # seconds a restart of this gang computes nothing (over its tier's restart_overhead_seconds) and its
        # SIGTERM checkpoint takes (lost when termination_grace_period is shorter): the scheduler's victim cost
        self.restart_overhead_seconds = restart_overhead_seconds
        self.checkpoint_seconds = checkpoint_seconds
        self.container_resources = {k: dict(v) for k, v in (container_resources or {}).items()}
        self.topology = topology
        self.topology_required = topology_required
        self.gang_backend = gang_backend
        self.kubernetes_conn_id = kubernetes_conn_id
        self.namespace = plan.namespace
        self.config_file = path
        self.deferrable = deferrable
        self.poll_interval = float(poll_interval)
        # logs and kept objects, as KubernetesPodOperator names them (operators/gang_logs.py)
        self.get_logs = get_logs
        self.logging_interval = logging_interval
        self.log_tail_lines = log_tail_lines
        self.on_finish_action = on_finish_action
        self.priority_class = plan.priority_class
        self.tier_class = plan.tier_class
        self._dry_run(bad)

    def _dry_run(self, bad) -> None:
        """Build the first attempt's WorkloadSpec now (kube/ validates the Kubernetes side: names,
        labels, env, secrets, resources, backend, topology), so its errors are parse errors too.
        Templated values are only known at run time: with a Jinja template among them, skipped."""
        from airflow_gpu.kube.manifests import build
        from airflow_gpu.kube.names import TaskInstanceRef
        from airflow_gpu.kube.spec import WorkloadSpecError
        from airflow_gpu.operators.arguments import ArgumentProblem

        if any(_templated(getattr(self, name)) for name in self.template_fields):
            return
        ref = TaskInstanceRef(self.dag_id if self.has_dag() else "dag", self.task_id, "parse")
        try:
            build(self.workload_spec(ref, new_run(1), self.capacity_for().capacity_type))
        except ArgumentProblem as exc:
            raise bad(exc.argument, exc.message) from None
        except WorkloadSpecError as exc:
            text = str(exc)
            argument = _LEADING_NAME.match(text).group(0) if _LEADING_NAME.match(text) else "arguments"
            if argument == "checkpoint_uri":
                argument = "checkpoint"
            if argument == "capacity_labels":
                argument = f"[{CONFIG_SECTION}] {CAPACITY_LABELS_OPTION}"
            if argument == "pod":
                argument = self._template_argument()
            if argument == "container_name":
                argument = "base_container_name"
            raise bad(argument, text) from None

    # -- derived values, recomputed from the (cached) config where they decide -------------------

    def gpu_plan(self) -> GpuTaskPlan:
        if self.pod_sets:
            return plan_pod_set_task(load_config_cached(self.config_file), team=self.team, tier=self.tier,
                                     pod_sets=self.pod_sets, gpu_products=self.gpu_products)
        return plan_gpu_task(load_config_cached(self.config_file), team=self.team, tier=self.tier,
                             workers=self.workers, gpus_per_worker=self.gpus_per_worker,
                             mig_profile=self.mig_profile, gpu_products=self.gpu_products)

    def restart_overhead(self) -> float:
        """Seconds each relaunch of this gang computes nothing: its restart_overhead_seconds, else its tier's."""
        tiers = load_config_cached(self.config_file).tier_policies()
        return restart_overhead_of(tiers.get(self.tier), self.restart_overhead_seconds)

    def capacity_for(self, interruptions: int = 0, try_number: int = 1, seconds_to_deadline: float | None = None,
                     seconds_run: float = 0.0):
        """Spot or on-demand for the next launch: core.capacity decides."""
        cfg = load_config_cached(self.config_file)
        return choose_capacity(
            self.spot, tier_allows_spot=cfg.tier(self.tier).spot_eligible, checkpointable=self.checkpoint is not None,
            retriable=self.retries > 0, interruptions=interruptions, max_interruptions=self.max_interruptions,
            last_try=try_number > self.retries, seconds_to_deadline=seconds_to_deadline, seconds_run=seconds_run)

    # -- running: submit, defer, classify, resubmit ---------------------------------------------
    #
    # The run of one try is a small JSON record (`RunState`), kept in the task's durable state
    # (task_state_store) after every change and carried through the deferral's kwargs: which attempt
    # of the gang is out there (its object UIDs), and the try's counters for the XCom result.

    def execute(self, context):
        self.check_before_create()
        ti = context["ti"]
        store = context.get("task_state_store")
        stored = store.get(STATE_KEY) if store is not None else None
        kube = self._client()
        ref = self._task_instance(context)
        if stored and stored.get("try") == ti.try_number:
            run = dict(stored)
            live = kube.live_uids(self.namespace, _attempt_selector(ref, run["attempt"]))
            if run.get("uids") and all(live.get(k) == v for k, v in run["uids"].items() if k.startswith("Pod/")):
                self.log.info("reattaching to gang %s (attempt %s): its pods are still there, same UIDs",
                              run["gang"], run["attempt"])
                return self._defer(run, context)
            self.log.info("gang %s of this try is gone or incomplete after a worker restart: resubmitting", run["gang"])
            run["attempt"] += 1
        else:
            if stored:
                self.log.info("try %s: earlier try %s left state behind; its objects are deleted first",
                              ti.try_number, stored.get("try"))
            resumed = (stored or {}).get("last_checkpoint_step")
            if resumed is None and ti.try_number > 1:  # no state kept: the store says where the retry resumes
                resumed = self._newest_step({"checkpoint_uri": self._status_uri(ref)})
            run = new_run(ti.try_number, resumed_from_step=resumed)
        self._delete_objects(kube, ref, wait=True)  # nothing of an earlier try or attempt stays around (but kept pods)
        self._delete_expired_kept(kube)
        return self._launch(run, context, kube)

    def execute_complete(self, context, event=None, run=None):
        from airflow.exceptions import AirflowException

        from airflow_gpu.kube.outcome import GangOutcome

        kube = self._client()
        ref = self._task_instance(context)
        run = dict(run or (context.get("task_state_store").get(STATE_KEY) if context.get("task_state_store") else {}))
        outcome = GangOutcome.from_payload(event or {})
        if outcome.gpu_product:  # where the scheduler bound it (a gang accepting several products)
            run["gpu_product"] = outcome.gpu_product
        restart_key = LOST_GPU_SECONDS_KEYS[CAUSE_RESTART]
        lost_before, restart_before = run.get("lost_gpu_seconds", 0.0), run.get(restart_key, 0.0)
        self._account(run, outcome)
        restart = run.get(restart_key, 0.0) - restart_before
        self._emit_metrics(run, outcome, run.get("lost_gpu_seconds", 0.0) - lost_before - restart, restart)
        self.log.info("attempt %s (gang %s) ended: %s%s, after %.0fs running", outcome.attempt, outcome.gang,
                      outcome.status, f" ({outcome.reason})" if outcome.reason else "", outcome.running_seconds)
        log_ranks(self.log, outcome, self.namespace)
        if outcome.status == "succeeded":
            self.log.info("gang %s succeeded: %s", outcome.gang, outcome.reason)
            self._finish(kube, ref, context, run, succeeded=True)
            try:
                value = result_of(outcome)
            except ResultError as exc:
                raise AirflowException(f"gang {outcome.gang} succeeded but its result is unusable: {exc}") from None
            return {**self._result(run), "result": value}
        if outcome.status == "disrupted":
            kind = "preemptions" if outcome.disruption_kind == CAUSE_PREEMPTION else "interruptions"
            run[kind] += 1
            self._delete_objects(kube, ref, wait=True)  # the stop-save on SIGTERM is committed once they are gone
            step = self._newest_step(run)
            if step is not None:
                run["last_checkpoint_step"] = step
            self.log.warning("gang %s %s (%s): %s; the whole gang is torn down and resubmitted from the newest "
                             "checkpoint%s, without spending a retry", outcome.gang,
                             "preempted" if kind == "preemptions" else "interrupted", outcome.reason,
                             ", ".join(f"{p}: {r}" for p, r in outcome.disrupted_pods.items()) or "-",
                             f" (step {run['last_checkpoint_step']})" if run.get("last_checkpoint_step") is not None
                             else " (none yet: from the start)")
            run["resumed_from_step"] = run.get("last_checkpoint_step")
            run["attempt"] += 1
            run["launch_reason"] = (f"relaunch after the {'preemption' if kind == 'preemptions' else 'interruption'} "
                                    f"of attempt {outcome.attempt}")
            return self._launch(run, context, kube)
        self._finish(kube, ref, context, run, succeeded=False)
        self._skip_on_exit_code(outcome)
        if outcome.status == "failed":
            raise AirflowException(application_failure(outcome, run) + f" Exit codes: {outcome.exit_codes or '?'}.")
        raise AirflowException(f"gang {outcome.gang}: the trigger could not follow it ({outcome.reason}); its objects "
                               "were deleted; Airflow retries the task if retries remain" + disruptions_note(run))

    def resume_execution(self, next_method, next_kwargs, context):
        """Also on a deferral that ended in failure (execution_timeout while deferred, trigger error):
        delete the gang before the task fails, so nothing is left behind, and say where it was."""
        try:
            return super().resume_execution(next_method, next_kwargs, context)
        except Exception as exc:
            if next_method == "__fail__" or not self._done:
                where = self._where_it_was(context) if next_method == "__fail__" else ""
                self._cleanup_quietly(context)
                if where:  # the same exception type (Airflow treats a deferral timeout as such), saying more
                    raise type(exc)(f"{exc or type(exc).__name__}: {where}") from exc
            raise

    def _where_it_was(self, context) -> str:
        """For a deferral that timed out: the gang's state then (for a gang still queued, the
        scheduler's last wait reason), read before its objects are deleted; "" if unknown."""
        try:
            from airflow_gpu.kube.backends import group_resource
            from airflow_gpu.kube.state import gang_state

            store = context.get("task_state_store")
            run = (store.get(STATE_KEY) if store is not None else None) or {}
            if not run.get("gang"):
                return ""
            kube = self._client()
            ref = self._task_instance(context)
            pods = kube.pods(self.namespace, _attempt_selector(ref, run["attempt"]))
            group = kube.group(self.namespace, run["gang"], group_resource(self.gang_backend))
            state = gang_state(pods, group, expected_names=run.get("pods") or None,
                               container=self.base_container_name)
        except Exception as exc:  # noqa: BLE001 - the timeout's own message stands
            self.log.info("could not read the gang's state: %s", exc)
            return ""
        if state.phase == "pending":
            return (f"gang {run['gang']} (attempt {run['attempt']}) was still waiting to be scheduled; last wait "
                    f"reason: {state.wait_reason or 'none given'}. Ask for fewer GPUs, another tier, or a longer "
                    "execution_timeout" + disruptions_note(run))
        return f"gang {run['gang']} (attempt {run['attempt']}) was {state.describe()}" + disruptions_note(run)

    def on_kill(self) -> None:
        context = getattr(self, "_context", None)
        if context is not None:
            self._cleanup_quietly(context)

    # -- pieces ------------------------------------------------------------------------------------

    _done = False

    def _client(self):
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        from airflow_gpu.kube.retry import with_retries
        from airflow_gpu.operators.cluster import GangClient

        return GangClient(with_retries(KubernetesHook(conn_id=self.kubernetes_conn_id).api_client), self.log,
                          on_quota=self._defer_for_quota)

    def _task_instance(self, context):
        from airflow_gpu.kube.names import TaskInstanceRef

        ti = context["ti"]
        self._context = context
        map_index = getattr(ti, "map_index", -1)
        return TaskInstanceRef(ti.dag_id, ti.task_id, ti.run_id, -1 if map_index is None else map_index,
                               ti.try_number)

    def checkpoint_uri_for(self, ref) -> str | None:
        """The task instance's store under the `checkpoint` prefix, the same for every try and attempt."""
        if self.checkpoint is None:
            return None
        parts = [ref.dag_id, ref.task_id, ref.run_id] + ([str(ref.map_index)] if ref.map_index >= 0 else [])
        return "/".join([self.checkpoint.rstrip("/")] + [_SAFE_KEY.sub("_", p) for p in parts])

    def workload_spec(self, ref, run: dict, capacity_type: str | None):
        from airflow_gpu.kube.spec import WorkloadSpec

        deadline = None
        if isinstance(self.deadline, dt.datetime):
            deadline = self.deadline.isoformat()
        elif isinstance(self.deadline, dt.timedelta):
            deadline = dt.datetime.fromtimestamp(run["started"] + self.deadline.total_seconds(), dt.timezone.utc).isoformat()
        return WorkloadSpec(
            team=self.team, namespace=self.namespace, tier=self.tier, image=self.image, workers=self.workers,
            gpus_per_worker=self.gpus_per_worker, mig_profile=self.mig_profile, gpu_products=tuple(self.gpu_products),
            task_instance=ref, attempt=run["attempt"], interruptions=run["interruptions"],
            preemptions=run["preemptions"],
            priority_class=self.priority_class, capacity_type=capacity_type, topology=self.topology,
            topology_required=self.topology_required, checkpoint_uri=self.checkpoint_uri_for(ref), deadline=deadline,
            cmds=tuple(self.cmds or ()), arguments=tuple(self.arguments or ()), env_vars=self.env_vars,
            secrets=tuple(self.secrets), labels=self.labels, annotations=self.annotations, volumes=tuple(self.volumes),
            volume_mounts=tuple(self.volume_mounts), node_selector=self.node_selector,
            tolerations=tuple(self.tolerations), service_account_name=self.service_account_name,
            termination_grace_period=self.termination_grace_period, container_resources=self.container_resources,
            restart_overhead_seconds=self.restart_overhead_seconds, checkpoint_seconds=self.checkpoint_seconds,
            gang_backend=self.gang_backend, capacity_labels=capacity_labels_setting(),
            schedule_timeout_seconds=self.schedule_timeout_seconds, pod_template=self._pod_template(),
            container_name=self.base_container_name,
            # every rank its own store (<uri>/rank-<r>): training code that saves from every rank never
            # races itself; rank 0's store is the gang's progress (status.json) and the XCom result
            checkpoint_per_rank=self.checkpoint is not None, pod_sets=self.pod_sets)

    def _pod_template(self) -> dict | None:
        """The author's pod template (pod_template_file / pod_template_dict / full_pod_spec) with the
        KPO-style pod arguments laid over it (operators/arguments.py)."""
        from airflow_gpu.kube.template import merge_templates
        from airflow_gpu.operators import arguments as A

        kpo = A.kpo_pod_template(
            container_name=self.base_container_name, env_sources=self.env_sources, env_from=self.env_from,
            secret_volumes=self.secret_volumes, image_pull_secrets=self.image_pull_secrets,
            image_pull_policy=self.image_pull_policy, affinity=self.affinity, security_context=self.security_context,
            container_security_context=self.container_security_context, init_containers=self.init_containers)
        template = A.load_template(self.pod_template_file, self.pod_template_dict, self.full_pod_spec)
        return merge_templates(template, kpo) if template or kpo else None

    def _template_argument(self) -> str:
        return next((n for n in ("pod_template_file", "pod_template_dict", "full_pod_spec") if getattr(self, n)),
                    "pod template (from the KPO-style arguments)")

    def check_before_create(self) -> None:
        """After rendering, before anything is created: no credential by value, and every argument
        valid (templated values are only known now). A failure here is deterministic: it fails the
        task without spending a retry, naming the argument and never the secret."""
        from airflow_gpu.operators import arguments as A

        problem = A.credential_by_value({name: getattr(self, name, None) for name in A.VALUE_ARGUMENTS})
        if problem is not None:
            raise A.fail_without_retry(self.task_id, GpuTaskArgumentError(self.task_id, problem.argument,
                                                                          problem.message))
        try:
            self._dry_run(lambda argument, message: GpuTaskArgumentError(self.task_id, argument, message))
        except GpuTaskArgumentError as exc:
            raise A.fail_without_retry(self.task_id, exc) from None

    def _skip_on_exit_code(self, outcome) -> None:
        """KPO's skip_on_exit_code for a gang: skipped when every failed member exited with one of them."""
        from airflow_gpu.operators.arguments import skip_exception

        skip = skip_exception(outcome, self.skip_on_exit_code)
        if skip is not None:
            raise skip

    def _fail_if_refused_as_invalid(self, exc: BaseException, context) -> None:
        """The API server refused an object of the gang as invalid (a field the cluster does not
        accept, e.g. a hostPath volume on the local cluster): what was created goes, and the task fails
        without spending a retry (the same spec would be refused again), with the API's message."""
        from airflow_gpu.operators import arguments as A
        from airflow_gpu.operators.cluster import invalid_refusal

        message = invalid_refusal(exc)
        if message is None:
            return
        self._cleanup_quietly(context)
        argument = self._template_argument() if (self.pod_template_file or self.pod_template_dict
                                                 or self.full_pod_spec) else "arguments"
        raise A.fail_without_retry(self.task_id, GpuTaskArgumentError(
            self.task_id, argument, f"the Kubernetes API refused the gang's objects: {message}; fix the field it "
                                    "names")) from None

    def _defer_for_quota(self, what: str, message: str) -> None:
        """A ResourceQuota refused `what`: defer for poll_interval (the worker slot is freed) and
        submit the same attempt again (what was created is adopted). The run state was saved just
        before creation; without a state store, GangClient waits in place as before."""
        context = getattr(self, "_context", None)
        store = context.get("task_state_store") if context else None
        run = store.get(STATE_KEY) if store is not None else None
        if not run:
            return
        from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

        self.log.info("waiting for quota: %s refused by a ResourceQuota (%s); deferred for %.0f s, no worker slot "
                      "held, then the gang is submitted again", what, message, self.poll_interval)
        self.defer(trigger=TimeDeltaTrigger(dt.timedelta(seconds=self.poll_interval)),
                   method_name="execute_after_quota", kwargs={"run": dict(run)})

    def execute_after_quota(self, context, event=None, run=None):
        """Back from a quota wait: the same attempt again (_launch counts a submission, so one back)."""
        run = dict(run)
        run["attempts"] -= 1
        return self._launch(run, context, self._client())

    def _launch(self, run: dict, context, kube):
        from airflow_gpu.kube.manifests import build

        ref = self._task_instance(context)
        now = time.time()
        to_deadline = None
        if isinstance(self.deadline, dt.datetime):
            to_deadline = self.deadline.timestamp() - now
        elif isinstance(self.deadline, dt.timedelta):
            to_deadline = run["started"] + self.deadline.total_seconds() - now
        choice = self.capacity_for(interruptions=run["interruptions"], try_number=ref.try_number,
                                   seconds_to_deadline=to_deadline, seconds_run=now - run["started"])
        spec = self.workload_spec(ref, run, choice.capacity_type)
        manifests = build(spec)
        run.update(gang=spec.gang_name, capacity=choice.capacity_type, uids={}, attempts=run["attempts"] + 1,
                   pods=[p["metadata"]["name"] for p in manifests.pods], gpus=_gang_gpus(spec, load_config_cached(self.config_file)),
                   checkpoint_uri=spec.checkpoint_uri_of(0),
                   gpu_product=self.gpu_products[0] if len(self.gpu_products) == 1 else None)
        self._save(context, run)  # the names first: a worker dying mid-creation is found by them
        self.log.info("attempt %s starts: %s", run["attempt"], run.pop("launch_reason", None) or
                      ("a new try" if run["attempts"] == 1 else "resubmitted after a worker restart"))
        self.log.info("submitting gang %s: %s in %s, attempt %s, %s (%s)%s", spec.gang_name, _shape(self),
                      self.namespace,
                      run["attempt"], choice.capacity_type, choice.reason,
                      f", resuming from checkpoint step {run['resumed_from_step']}"
                      if run.get("resumed_from_step") is not None else "")
        labels = {**ref.labels(), C.LABEL_ATTEMPT: str(run["attempt"])}
        try:
            run["uids"] = kube.create(manifests, labels, self.poll_interval)
        except Exception as exc:
            if kube.last_refusal and type(exc).__name__ == "AirflowTaskTimeout":
                raise type(exc)(f"{exc}: the gang {spec.gang_name} never fit its namespace's ResourceQuota; last "
                                f"refusal: {kube.last_refusal}. Free quota, ask for fewer GPUs or a longer "
                                "execution_timeout") from exc
            self._fail_if_refused_as_invalid(exc, context)
            raise
        run["submitted"] = time.time()
        self._save(context, run)
        return self._defer(run, context)

    def _defer(self, run: dict, context):
        from airflow_gpu.kube.backends import group_resource
        from airflow_gpu.triggers.gang import GangTrigger

        ref = self._task_instance(context)
        gr = group_resource(self.gang_backend)
        trigger = GangTrigger(
            namespace=self.namespace, gang_name=run["gang"], pod_names=list(run["pods"]), attempt=run["attempt"],
            pod_uids={k.split("/", 1)[1]: v for k, v in run["uids"].items() if k.startswith("Pod/")},
            group={"group": gr.group, "version": gr.version, "plural": gr.plural} if gr else None,
            label_selector=_attempt_selector(ref, run["attempt"]), kubernetes_conn_id=self.kubernetes_conn_id,
            poll_interval=self.poll_interval, checkpoint_status_uri=self._status_uri(ref),
            # marked failed / cleared while deferred: the trigger deletes the task instance's objects
            cleanup_selector=ref.selector(), cleanup_grace_period=self.termination_grace_period,
            settle_seconds=deferral_settle_setting(), get_logs=self.get_logs,
            logging_interval=self.logging_interval if self.get_logs else None, log_tail_lines=self.log_tail_lines,
            preemption_record=self._preemption_record(), container_name=self.base_container_name)
        timeout = None
        if self.execution_timeout is not None and context["ti"].start_date is not None:
            started = context["ti"].start_date
            timeout = max(dt.timedelta(seconds=1), self.execution_timeout - (dt.datetime.now(dt.timezone.utc) - started))
        self.defer(trigger=trigger, method_name="execute_complete", kwargs={"run": run}, timeout=timeout)

    def _preemption_record(self) -> dict[str, str] | None:
        """Where the airflow-gpu scheduler records the pods it preempted (other backends' schedulers
        keep no such record: their evictions are read from the pods alone)."""
        if self.gang_backend != C.GANG_BACKEND_AIRFLOW_GPU:
            return None
        from airflow_gpu.kube.preemptions import record_name

        return {"namespace": scheduler_namespace_setting(), "name": record_name(C.DEFAULT_SCHEDULER_NAME)}

    def _status_uri(self, ref) -> str | None:
        base = self.checkpoint_uri_for(ref)
        return f"{base}/rank-0" if base else None  # WorkloadSpec.checkpoint_uri_of(0)

    def _account(self, run: dict, outcome) -> None:
        """The try's GPU-seconds and those lost since the last checkpoint, in total, per cause and per
        capacity type of the attempt (the chargeback prices a try from them once its pods are gone)."""
        gpus = float(run.get("gpus") or 0)
        used = outcome.running_seconds * gpus
        # the capacity type this attempt was launched on (its pods are pinned to it)
        part = run.setdefault(USAGE_BY_CAPACITY, {}).setdefault(
            run.get("capacity") or CAPACITY_UNKNOWN, {"gpu_seconds": 0.0, **dict.fromkeys(LOST_GPU_SECONDS_KEYS.values(), 0.0)})
        run["gpu_seconds"] += used
        part["gpu_seconds"] += used
        begin = outcome.started_at
        restart = run.get("interruptions", 0) + run.get("preemptions", 0) > 0  # a relaunch: it restarted first
        if restart and outcome.running_seconds > 0:
            overhead = self.restart_overhead()
            paid = restart_lost_gpu_seconds(gpus, overhead, outcome.running_seconds)
            key = LOST_GPU_SECONDS_KEYS[CAUSE_RESTART]
            run["lost_gpu_seconds"] += paid
            run[key] = run.get(key, 0.0) + paid
            part[key] = part.get(key, 0.0) + paid
            if begin is not None:  # the work at risk of a disruption began after the restart
                begin += min(overhead, outcome.running_seconds)
        if outcome.status == "disrupted" and begin is not None and outcome.finished_at is not None:
            lost = gpu_seconds_lost(gpus, begin, outcome.finished_at, outcome.last_checkpoint_time or None)
            run["lost_gpu_seconds"] += lost
            key = LOST_GPU_SECONDS_KEYS[outcome.disruption_kind]
            run[key] = run.get(key, 0.0) + lost
            part[key] += lost
        if outcome.last_checkpoint_step is not None:
            run["last_checkpoint_step"] = outcome.last_checkpoint_step

    def _emit_metrics(self, run: dict, outcome, lost_gpu_seconds: float, restart_gpu_seconds: float = 0.0) -> None:
        """Stats (airflow_gpu/metrics.py) for the attempt that just ended: its queue wait, on a
        disruption the interruption and the GPU-seconds lost since its last checkpoint, and for a
        relaunch the GPU-seconds its restart overhead took."""
        from airflow_gpu import metrics

        product = run.get("gpu_product") or "any"
        try:
            if outcome.started_at is not None and run.get("submitted"):
                metrics.observe_queue_wait(self.team, self.tier, product, max(0.0, outcome.started_at - run["submitted"]))
            if outcome.status == "disrupted":
                cause = outcome.disruption_kind
                if cause == CAUSE_INTERRUPTION:
                    metrics.count_interruption(self.team, self.tier, product, run.get("capacity") or CAPACITY_UNKNOWN)
                metrics.count_lost_gpu_seconds(self.team, self.tier, cause, max(0.0, lost_gpu_seconds))
            if restart_gpu_seconds > 0:
                metrics.count_lost_gpu_seconds(self.team, self.tier, CAUSE_RESTART, restart_gpu_seconds)
        except Exception as exc:  # noqa: BLE001 - a metric never fails the task
            self.log.warning("could not emit metrics: %s", exc)

    def _newest_step(self, run: dict) -> int | None:
        """The step of rank 0's newest committed checkpoint, from its status record (read with the
        worker's S3 credentials or pod identity); None when there is none or it cannot be read."""
        uri = run.get("checkpoint_uri")
        if not uri:
            return None
        try:
            from airflow_gpu.checkpoint.store import read_status_of

            status = read_status_of(uri) or {}
        except Exception as exc:  # noqa: BLE001 - the trigger's mirrored step is the fallback
            self.log.info("could not read %s/status.json: %s", uri, exc)
            return None
        step = status.get("step")
        return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None

    def _finish(self, kube, ref, context, run: dict, succeeded: bool = False) -> None:
        self._done = True
        if keeps(self.on_finish_action, succeeded):
            try:
                keep_ended_pods(kube, self.namespace, _attempt_selector(ref, run["attempt"]), self.log,
                                dt.datetime.now(dt.timezone.utc))
            except Exception as exc:  # noqa: BLE001 - keeping is for debugging: never fail the task over it
                self.log.warning("could not keep the gang's pods: %s", exc)
        self._delete_objects(kube, ref, wait=False)
        run["finished"] = time.time()
        self._save(context, run)

    def _delete_objects(self, kube, ref, wait: bool) -> None:
        from airflow_gpu.kube.backends import group_resource

        gr = group_resource(self.gang_backend)
        selector = ref.selector()

        def spare(pod: dict) -> bool:  # pods kept by on_finish_action stay until their keep-until time
            return is_kept(pod, dt.datetime.now(dt.timezone.utc))

        asked = kube.delete_all(self.namespace, selector, gr, spare=spare)
        if asked:
            self.log.info("deleting %s object(s) of this task instance (%s)", asked, selector)
        if wait and asked:
            deadline = time.monotonic() + max(60.0, (self.termination_grace_period or 30) + 60.0)
            while kube.remaining(self.namespace, selector, gr, spare=spare) and time.monotonic() < deadline:
                time.sleep(0.5)

    def _delete_expired_kept(self, kube) -> None:
        try:
            delete_expired_kept(kube, self.namespace, dt.datetime.now(dt.timezone.utc), self.log)
        except Exception as exc:  # noqa: BLE001 - housekeeping never fails a task
            self.log.info("could not delete expired kept pods: %s", exc)

    def _cleanup_quietly(self, context) -> None:
        try:
            self._delete_objects(self._client(), self._task_instance(context), wait=False)
        except Exception:  # noqa: BLE001 - cleanup must not hide the error that brought us here
            self.log.exception("could not delete the objects of this task instance")

    def _save(self, context, run: dict) -> None:
        store = context.get("task_state_store")
        if store is not None:
            from airflow.sdk.execution_time.context import NEVER_EXPIRE

            store.set(STATE_KEY, run, retention=NEVER_EXPIRE)

    def _result(self, run: dict) -> dict:
        """The XCom value. checkpoint_uri: the newest checkpoint of rank 0 (its status.json, read with
        the worker's S3 credentials), else rank 0's store."""
        newest = run.get("checkpoint_uri")
        if newest:
            try:
                from airflow_gpu.checkpoint.store import read_status_of

                status = read_status_of(newest) or {}
                newest = status.get("checkpoint_uri") or newest
            except Exception as exc:  # noqa: BLE001 - the result still names the store
                self.log.info("could not read %s/status.json (%s); reporting the store", newest, exc)
        return {"checkpoint_uri": newest, "attempts": run["attempts"],
                "interruptions": run["interruptions"], "preemptions": run["preemptions"],
                "gpu_seconds": round(run["gpu_seconds"], 3), "lost_gpu_seconds": round(run["lost_gpu_seconds"], 3),
                **{key: round(run.get(key, 0.0), 3) for key in LOST_GPU_SECONDS_KEYS.values()},
                USAGE_BY_CAPACITY: {cap: {k: round(v, 3) for k, v in part.items()}
                                    for cap, part in run.get(USAGE_BY_CAPACITY, {}).items()},
                "resumed_from_step": run.get("resumed_from_step"), "gpu_product": run.get("gpu_product")}


MAPPED_CHECK_LIMIT = 64  # literal expand() values checked at parse time per argument (parse stays cheap)
_MAPPED_HINT = ("; in a mapped task the arguments that decide the pool and priority (team, tier, workers, gpus_per_worker, "
                "mig_profile, gpu_products, pod_sets, config_file) cannot be expanded: give them to partial()")


@functools.cache
def _operator_partial_class():
    from airflow.sdk.definitions.mappedoperator import OperatorPartial

    class GpuOperatorPartial(OperatorPartial):
        """partial() of GpuTrainingOperator: expand() over a pool-deciding argument is a parse error."""

        __slots__ = ()

        def expand(self, **mapped_kwargs):
            from airflow_gpu.operators.arguments import POOL_ARGUMENTS

            mapped = [n for n in POOL_ARGUMENTS if n in mapped_kwargs]
            if mapped:
                raise GpuTaskArgumentError(self.kwargs.get("task_id", "?"), mapped[0],
                                           "decides the task's pool and priority, which the scheduler needs before "
                                           "the task is expanded" + _MAPPED_HINT)
            self._check_literal_values(mapped_kwargs)
            return super().expand(**mapped_kwargs)

        def _check_literal_values(self, mapped_kwargs) -> None:
            """What can be checked at parse time is: the partial() arguments with each literal expand()
            value, through the operator's own parse checks, built outside the DAG (DagContext None, as
            Airflow's serialization does). A value from XCom is known only at run time: the others are
            checked without it when its absence cannot make another argument wrong (INDEPENDENT_ARGUMENTS),
            else at run time only."""
            from airflow.sdk.definitions._internal.contextmanager import DagContext

            from airflow_gpu.operators.arguments import INDEPENDENT_ARGUMENTS

            literal = {k: v for k, v in mapped_kwargs.items() if isinstance(v, (list, tuple)) and v}
            if not set(mapped_kwargs) - set(literal) <= INDEPENDENT_ARGUMENTS:
                return
            fixed = {k: v for k, v in self.kwargs.items() if k not in ("dag", "task_group")}
            first = {k: v[0] for k, v in literal.items()}
            checks = [(name, i, value) for name, values in literal.items()
                      for i, value in enumerate(values[:MAPPED_CHECK_LIMIT])] or [(None, 0, None)]
            DagContext.push(None)
            checking = _PARSE_CHECK.set(True)
            try:
                for name, i, value in checks:
                    try:
                        self.operator_class(**fixed, **({**first, name: value} if name else first),
                                            _airflow_from_mapped=True)
                    except GpuTaskArgumentError as exc:
                        where = f"expand({name}=[...]) item {i}" if name else "partial()"
                        raise GpuTaskArgumentError(fixed.get("task_id", "?"), exc.argument,
                                                   f"{where}: {exc.detail}") from None
            finally:
                _PARSE_CHECK.reset(checking)
                DagContext.pop()

        def expand_kwargs(self, kwargs, *, strict: bool = True):
            """expand_kwargs() over literal dicts: none may hold a pool-deciding argument (from XCom,
            their keys are known at run time, where the task's own checks fail it without a retry)."""
            if isinstance(kwargs, (list, tuple)):
                from airflow_gpu.operators.arguments import POOL_ARGUMENTS

                for i, item in enumerate(kwargs):
                    mapped = [n for n in POOL_ARGUMENTS if isinstance(item, Mapping) and n in item]
                    if mapped:
                        raise GpuTaskArgumentError(self.kwargs.get("task_id", "?"), mapped[0],
                                                   f"expand_kwargs([...]) item {i}: decides the task's pool and "
                                                   "priority, which the scheduler needs before the task is "
                                                   "expanded" + _MAPPED_HINT)
            return super().expand_kwargs(kwargs, strict=strict)

    return GpuOperatorPartial


def new_run(try_number: int, resumed_from_step: int | None = None) -> dict:
    """The RunState of a fresh try. ENV.md's attempt numbering: try_number * 1000 + relaunches, so
    AIRFLOW_GPU_ATTEMPT strictly increases across relaunches and tries."""
    return {"try": try_number, "attempt": try_number * 1000, "attempts": 0, "interruptions": 0, "preemptions": 0,
            "gpu_seconds": 0.0, "lost_gpu_seconds": 0.0, **dict.fromkeys(LOST_GPU_SECONDS_KEYS.values(), 0.0),
            "resumed_from_step": resumed_from_step,  # a retry resumes from the newest checkpoint of the store
            "last_checkpoint_step": resumed_from_step, "started": time.time(), "gang": None, "pods": [], "uids": {}}


def _templated(value) -> bool:
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, Mapping):
        return any(_templated(k) or _templated(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_templated(v) for v in value)
    return False


def _attempt_selector(ref, attempt: int) -> str:
    return f"{ref.selector()},{C.LABEL_ATTEMPT}={attempt}"


def _parsed_pod_sets(task_id: str, kwargs) -> tuple:
    """The pod_sets argument checked (operators/pod_sets.py), () when not given."""
    from airflow_gpu.operators import pod_sets as P

    if kwargs.get("pod_sets") is None:
        return ()
    problem = P.pod_sets_conflict(kwargs.get("workers"), kwargs.get("gpus_per_worker"), kwargs.get("mig_profile"))
    try:
        if problem is not None:
            raise problem
        return P.parse_pod_sets(kwargs["pod_sets"])
    except P.ArgumentProblem as exc:
        raise GpuTaskArgumentError(task_id, exc.argument, exc.message) from None


def _shape(op) -> str:
    from airflow_gpu.operators.pod_sets import describe

    if op.pod_sets:
        return describe(op.pod_sets)
    return f"{op.workers} x " + (f"{op.gpus_per_worker} GPU" if op.gpus_per_worker else op.mig_profile)


def _gang_gpus(spec, cfg) -> float:
    from airflow_gpu.config.core import mig_gpus

    if spec.pod_sets:
        from airflow_gpu.operators.pod_sets import gang_gpus

        return gang_gpus(spec, cfg)

    if spec.gpus_per_worker:
        return float(spec.workers * spec.gpus_per_worker)
    return spec.workers * mig_gpus(spec.mig_profile, cfg, spec.gpu_products)
