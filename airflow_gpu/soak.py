"""`airflow-gpu soak --minutes N --seed S`: a chaos soak through real Airflow (issue 32, item 8).

The demo's platform (airflow_gpu.demo: SeaweedFS, the local cluster of examples/cluster-seed.yaml, the
GPU scheduler, Airflow's four processes), with S3 reached through a TCP proxy the soak can cut. The
checkpointed gangs of examples/soak_dags/ run continuously (team nlp's best-effort run, two research
sweeps) while the faults of a seeded schedule are injected, one after another:

    spot_interruption       a spot node under a running gang is taken back (2 s notice, replaced after 10 s)
    apiserver_restart       the Kubernetes API server is down for 0.9-4.9 s
    s3_outage               every S3 connection is cut and refused for 11-38 s
    triggerer_kill          Airflow's triggerer is killed (-9) and started again
    airflow_scheduler_kill  Airflow's scheduler is killed (-9; its LocalExecutor workers live on) and started again
    gpu_scheduler_kill      the GPU scheduler is killed (-9) and started again
    preemption              team nlp's production run arrives while its best-effort gang fills the quota

A thread samples the cluster every second and checks, at every sample: no team above quota + borrowing
(per GPU product), no node over-committed, no task instance with two attempts (or one rank twice) bound
at once. At the end, once every DAG run is over: nothing left in the team namespaces; every run
succeeded in Airflow try 1 (any later try is a retry the faults spent: the trainer never fails on its
own); each task's XCom counts as many interruptions and preemptions as the soak caused (interrupted
nodes under its gang; the scheduler's preemption record) and one attempt per disruption; its
resumed_from_step names a checkpoint whose manifest and objects are complete (checksums verified).
Counts are printed as a table and, with --json FILE, written as JSON. The options are parsed by the
command line (cli/soak.py), which calls run().
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from airflow_gpu import constants as C
from airflow_gpu.demo import REPO_ROOT, SEED_QUOTAS, TERMINAL_RUN_STATES, Demo, DemoFailed, _now, run_by_pid

SOAK_DAGS = REPO_ROOT / "examples" / "soak_dags"
BEST_EFFORT, PRODUCTION, SWEEP = "soak_best_effort", "soak_production", "soak_sweep"
TEAM_OF = {BEST_EFFORT: "nlp", PRODUCTION: "nlp", SWEEP: "research"}  # as examples/soak_dags/ sets team=
# DAG runs kept active all along (research: 12 GPUs on a quota of 8, borrowing); production arrives
# with the preemption fault
LANES = {BEST_EFFORT: 1, SWEEP: 3}
FAULT_KINDS = ("spot_interruption", "apiserver_restart", "s3_outage", "triggerer_kill", "airflow_scheduler_kill",
               "gpu_scheduler_kill", "preemption")
WARMUP_SECONDS = 25.0  # the first gangs bind before the first fault
ROUND_SECONDS = 175.0  # one fault of each kind per this much soak time (at least one round)
TARGET_WAIT_SECONDS = 90.0  # how long an interruption or preemption waits for a gang to hit
QUIET_TAIL_SECONDS = 30.0  # no new DAG run this close to the end of the soak time (once every fault is in)
# the preemption fault's victim started at most this long ago (its training lasts ~40 s, see
# examples/soak_dags/): the production run's pods must arrive before it ends
VICTIM_FRESH_SECONDS = 8.0


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the soak's start, not before
    kind: str
    seconds: float = 0.0  # how long the API server or S3 is down


def fault_schedule(seed: int, minutes: float) -> list[Fault]:
    """Rounds of the seven kinds, each round in a seeded order; the down times seeded too. The gaps
    share out what the rounds leave of the soak time after the warm-up."""
    rng = random.Random(seed)
    span = minutes * 60.0 - WARMUP_SECONDS
    rounds = max(1, int(span // ROUND_SECONDS))
    kinds = [k for _ in range(rounds) for k in rng.sample(FAULT_KINDS, len(FAULT_KINDS))]
    downs = [round(rng.uniform(11, 38), 1) if k == "s3_outage" else round(rng.uniform(0.9, 4.9), 1)
             if k == "apiserver_restart" else 0.0 for k in kinds]
    gap = max(2.0, (span - sum(downs)) / len(kinds))
    out, t = [], WARMUP_SECONDS
    for kind, down in zip(kinds, downs):
        out.append(Fault(round(t, 1), kind, down))
        t += down + gap * rng.uniform(0.5, 1.5)
    return out


# --- the invariants, sampled --------------------------------------------------------------------


@dataclass
class Violation:
    kind: str
    detail: str
    first: float  # seconds after the soak's start
    last: float
    samples: int = 1


@dataclass
class SoakPod:
    task: tuple[str, str, str, str, str]  # namespace, dag-id, task-id, run-id, map-index labels
    attempt: str
    rank: str
    node: str = ""


class Monitor:
    """Samples pods and nodes every `interval` seconds from a thread and records what breaks."""

    def __init__(self, api, config, started: float, interval: float = 1.0) -> None:
        self.api, self.started, self.interval = api, started, interval
        self.limits: dict[tuple[str, str], float] = {}  # (namespace, product) -> quota + borrowing
        self.product_of_label = {p.node_label or p.name: p.name for p in config.products}
        for team in config.teams:
            for product in set(team.quota) | set(team.borrowing_limit):
                self.limits[(team.namespace, product)] = team.quota.get(product, 0) + team.borrowing_limit.get(product, 0)
        self.namespaces = {t.namespace for t in config.teams}
        self.pods: dict[str, SoakPod] = {}  # uid -> what it was, for every soak pod seen bound
        self.violations: dict[tuple[str, str], Violation] = {}
        self.samples = self.failed_samples = 0
        self.peak_team_gpus: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def start(self) -> "Monitor":
        self._thread = threading.Thread(target=self._run, name="soak-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - the API server is down on purpose now and then
                self.failed_samples += 1
            self._stop.wait(self.interval)

    def listing(self) -> tuple[list[dict], dict[str, dict]]:
        from kubernetes import client

        core = client.CoreV1Api(self.api)
        nodes = {n["metadata"]["name"]: n for n in json.loads(core.list_node(_preload_content=False,
                                                                             _request_timeout=10).data)["items"]}
        pods = json.loads(core.list_pod_for_all_namespaces(_preload_content=False, _request_timeout=10).data)["items"]
        return pods, nodes

    def sample(self) -> None:
        pods, nodes = self.listing()
        now = _now() - self.started
        per_node: dict[str, float] = defaultdict(float)
        per_team: dict[tuple[str, str], float] = defaultdict(float)
        attempts: dict[tuple, set[str]] = defaultdict(set)
        ranks: Counter = Counter()
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            gpus = float(sum(int(((c.get("resources") or {}).get("limits") or {}).get(C.RESOURCE_GPU, 0))
                             for c in pod["spec"].get("containers", [])))
            if node in nodes:  # a pod on a node that is gone holds nothing (it is being cleaned up)
                per_node[node] += gpus
            meta = pod["metadata"]
            if meta["namespace"] not in self.namespaces:
                continue
            node_labels = (nodes.get(node, {}).get("metadata") or {}).get("labels") or {}
            product = self.product_of_label.get(node_labels.get(C.NODE_GPU_PRODUCT, ""), "?")
            per_team[(meta["namespace"], product)] += gpus
            labels = meta.get("labels") or {}
            if C.LABEL_DAG_ID not in labels:
                continue
            task = (meta["namespace"], labels[C.LABEL_DAG_ID], labels.get(C.LABEL_TASK_ID, ""),
                    labels.get(C.LABEL_RUN_ID, ""), labels.get(C.LABEL_MAP_INDEX, "-1"))
            attempt, rank = labels.get(C.LABEL_ATTEMPT, "?"), labels.get(C.LABEL_GANG_RANK, meta["name"])
            with self._lock:
                self.pods.setdefault(meta["uid"], SoakPod(task, attempt, rank, node))
            attempts[task].add(attempt)
            ranks[(task, attempt, rank)] += 1
        self.samples += 1
        for node, used in per_node.items():
            allocatable = int(nodes[node]["status"].get("allocatable", {}).get(C.RESOURCE_GPU, "0"))
            if used > allocatable:
                self._violate("node over-committed", f"{node}: {used:g} GPUs bound on {allocatable}", now)
        totals: dict[str, float] = defaultdict(float)
        for (ns, product), used in per_team.items():
            totals[ns] += used
            limit = self.limits.get((ns, product), 0)
            if product != "?" and used > limit:  # "?": on a node that is gone, counted in the total below
                self._violate("team above quota + borrowing", f"{ns} {product}: {used:g} GPUs bound, limit {limit:g}", now)
        for ns, used in totals.items():
            self.peak_team_gpus[ns] = max(self.peak_team_gpus[ns], used)
            limit = sum(v for (n, _), v in self.limits.items() if n == ns)
            if used > limit:
                self._violate("team above quota + borrowing", f"{ns}: {used:g} GPUs bound, limit {limit:g}", now)
        for task, seen in attempts.items():
            if len(seen) > 1:
                self._violate("gang bound twice", f"{'/'.join(task)}: attempts {sorted(seen)} bound at once", now)
        for (task, attempt, rank), n in ranks.items():
            if n > 1:
                self._violate("gang bound twice", f"{'/'.join(task)} attempt {attempt}: rank {rank} bound {n} times", now)

    def _violate(self, kind: str, detail: str, now: float) -> None:
        with self._lock:
            v = self.violations.get((kind, detail))
            if v is None:
                self.violations[(kind, detail)] = Violation(kind, detail, round(now, 1), round(now, 1))
            else:
                v.last, v.samples = round(now, 1), v.samples + 1

    def live_soak_pods(self, dag_ids: tuple[str, ...] | None = None) -> list[dict]:
        """Bound, running, not terminating soak pods right now (a fresh listing)."""
        pods, _ = self.listing()
        return [p for p in pods if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                and (p["metadata"].get("labels") or {}).get(C.LABEL_DAG_ID) in (dag_ids or tuple(LANES) + (PRODUCTION,))]


def task_of(pod: dict) -> tuple[str, str, str, str, str]:
    labels = pod["metadata"].get("labels") or {}
    return (pod["metadata"]["namespace"], labels[C.LABEL_DAG_ID], labels.get(C.LABEL_TASK_ID, ""),
            labels.get(C.LABEL_RUN_ID, ""), labels.get(C.LABEL_MAP_INDEX, "-1"))


# --- the soak -------------------------------------------------------------------------------------


@dataclass
class Injected:
    kind: str
    scheduled: float
    at: float = 0.0
    took: float = 0.0
    seconds: float = 0.0
    target: str = ""
    hit: list[str] = field(default_factory=list)  # task/attempt the fault disrupted (interruption, preemption)
    error: str = ""


@dataclass
class SoakRun:
    dag_id: str
    run_id: str
    triggered: float
    state: str = "queued"


class Soak(Demo):
    DAGS_FOLDER = SOAK_DAGS
    DAG_IDS = (BEST_EFFORT, PRODUCTION, SWEEP)
    WATCH = False  # the Monitor samples instead, at 1/s

    def __init__(self, workdir: Path, console: Console, minutes: float, seed: int) -> None:
        super().__init__(workdir, console, headless=True)
        self.minutes, self.seed = minutes, seed
        self.schedule = fault_schedule(seed, minutes)
        self.rng = random.Random(f"{seed}-targets")
        self.soak_runs: list[SoakRun] = []
        self.injected: list[Injected] = []
        self.expected: dict[tuple, dict[str, set[str]]] = defaultdict(lambda: {"interruptions": set(),
                                                                                "preemptions": set()})
        self._rest_lock = threading.Lock()
        self.rest_retries: list[str] = []

    # platform ------------------------------------------------------------------------------------

    def s3_endpoint(self) -> str:
        from airflow_gpu.devtools.tcpproxy import Proxy

        if not hasattr(self, "proxy"):
            self.proxy = Proxy(self.s3.ports["s3.port"]).start()
            self.stack.callback(self.proxy.cut)
        return f"http://127.0.0.1:{self.proxy.port}"

    def start_platform(self) -> None:
        super().start_platform()
        self.stack.callback(lambda: self.scheduler.stop())  # the one running at the end (restarts replace it)

    def rest_call(self, method: str, path: str, **kw):
        """Airflow's REST API, retried on no answer and 5xx for up to a minute: on SQLite, the
        api-server answered 500 "Database error" once while a killed scheduler's successor
        started (counted in the report; the soak's own calls, not the product's)."""
        from airflow_gpu.airflow_api import AirflowApiError

        deadline, delay = _now() + 60, 0.5
        while True:
            try:
                with self._rest_lock:
                    return self.rest.request(method, path, **kw)
            except AirflowApiError as exc:
                if (exc.status is not None and exc.status < 500) or _now() > deadline:
                    raise
                self.rest_retries.append(str(exc)[:200])
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def trigger_soak(self, dag_id: str) -> SoakRun:
        # a run id of our own: a POST retried after a 500 that did commit answers 409, never a second run
        run_id = f"soak__{self.seed}_{len(self.soak_runs):04d}_{dag_id}"
        self.rest_call("POST", f"/api/v2/dags/{dag_id}/dagRuns", ok=(200, 409),
                       json={"dag_run_id": run_id, "logical_date": None, "conf": {}})
        rec = SoakRun(dag_id, run_id, round(_now() - self.t0, 1))
        self.soak_runs.append(rec)
        self.say(f"triggered {dag_id} {rec.run_id}")
        return rec

    def refresh_runs(self) -> None:
        from airflow_gpu.airflow_api import AirflowApi

        for r in self.soak_runs:
            if r.state not in TERMINAL_RUN_STATES:
                r.state = self.rest_call("GET", f"/api/v2/dags/{r.dag_id}/dagRuns/{AirflowApi.quote(r.run_id)}")["state"]

    def active(self, dag_id: str) -> int:
        return sum(r.dag_id == dag_id and r.state not in TERMINAL_RUN_STATES for r in self.soak_runs)

    # faults ----------------------------------------------------------------------------------------

    def inject_all(self) -> None:
        for i, fault in enumerate(self.schedule):
            delay = self.t0 + fault.at - _now()
            if delay > 0 and self._done.wait(delay):
                return
            rec = Injected(fault.kind, fault.at, round(_now() - self.t0, 1), seconds=fault.seconds)
            t = _now()
            try:
                getattr(self, f"fault_{fault.kind}")(rec)
            except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is reported, not fatal
                rec.error = f"{type(exc).__name__}: {exc}"[:300]
            rec.took = round(_now() - t, 1)
            self.injected.append(rec)
            self.say(f"[bold magenta]fault {i + 1}/{len(self.schedule)}[/bold magenta] {rec.kind} "
                     f"{rec.target or ''} {f'{rec.seconds:g}s ' if rec.seconds else ''}(took {rec.took:g}s)"
                     + (f" hit {', '.join(rec.hit)}" if rec.hit else "")
                     + (f" [red]{escape(rec.error)}[/red]" if rec.error else ""))

    def _wait_for(self, find, what: str, wait: float = TARGET_WAIT_SECONDS):
        deadline = _now() + wait
        while not self._done.is_set():
            try:
                found = find()
            except Exception:  # noqa: BLE001 - the API may blink (an earlier fault)
                found = None
            if found:
                return found
            if _now() > deadline:
                raise TimeoutError(f"no {what} within {wait:.0f}s")
            time.sleep(1)
        raise TimeoutError("the soak ended first")

    def fault_spot_interruption(self, rec: Injected) -> None:
        from airflow_gpu.kube.convert import capacity_type_of

        def candidates() -> dict[str, list[dict]]:
            _, nodes = self.monitor.listing()
            spot = {n for n, node in nodes.items()
                    if capacity_type_of((node["metadata"].get("labels") or {})) == C.CAPACITY_SPOT}
            by_node: dict[str, list[dict]] = defaultdict(list)
            for pod in self.monitor.live_soak_pods():
                if pod["spec"]["nodeName"] in spot:
                    by_node[pod["spec"]["nodeName"]].append(pod)
            return dict(by_node)

        by_node = self._wait_for(candidates, "gang bound on spot")
        node = self.rng.choice(sorted(by_node))
        rec.target = node
        self.cluster.interrupt(node, notice=2.0, replace_after=10.0)
        for pod in by_node[node]:
            attempt = pod["metadata"]["labels"].get(C.LABEL_ATTEMPT, "?")
            self.expected[task_of(pod)]["interruptions"].add(attempt)
            rec.hit.append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")

    def fault_apiserver_restart(self, rec: Injected) -> None:
        self.cluster.restart_apiserver(rec.seconds)

    def fault_s3_outage(self, rec: Injected) -> None:
        rec.target = f"proxy :{self.proxy.port}"
        self.proxy.cut()
        try:
            self._done.wait(rec.seconds)
        finally:
            self.proxy.start()

    def fault_triggerer_kill(self, rec: Injected) -> None:
        rec.target = f"pid {self.airflow.processes['triggerer'].pid}"
        self.airflow.crash_and_restart("triggerer")

    def fault_airflow_scheduler_kill(self, rec: Injected) -> None:
        rec.target = f"pid {self.airflow.processes['scheduler'].pid}"
        # its LocalExecutor workers live on: a task in execute() finishes it (see the README: with them
        # killed too, Airflow fails such a task after its heartbeat timeout and spends a retry)
        self.airflow.crash_and_restart("scheduler", keep_children=True)

    def fault_gpu_scheduler_kill(self, rec: Injected) -> None:
        from airflow_gpu.devtools.gangs import scheduler_process

        old = self.scheduler
        rec.target = f"pid {old.pid}"
        old.kill9()
        old.stop(timeout=5)
        self.scheduler = scheduler_process(self.cluster.kubeconfig, self.workdir / "scheduler.log",
                                           config_path=SEED_QUOTAS, identity="demo-scheduler").start()

    def fault_preemption(self, rec: Injected) -> None:
        from airflow_gpu.kube.wire import parse_time

        def victims() -> list[dict]:
            if self.active(PRODUCTION):
                return []
            pods = self.monitor.live_soak_pods((BEST_EFFORT,))
            tasks = {task_of(p) for p in pods}
            if len(pods) < 2 or len(tasks) != 1:  # the gang (2 workers) is bound
                return []
            # a gang that started just now: one near its end could finish before the production run's
            # pods exist (Airflow starts the task first), and nothing would be preempted
            started = [parse_time((p.get("status") or {}).get("startTime")) for p in pods]
            return pods if all(started) and _now() - max(started) <= VICTIM_FRESH_SECONDS else []

        pods = self._wait_for(victims, f"{BEST_EFFORT} gang started within {VICTIM_FRESH_SECONDS:g}s (and no "
                              "production run)", wait=2 * TARGET_WAIT_SECONDS)  # the next one, at worst
        run = self.trigger_soak(PRODUCTION)
        rec.target = run.run_id
        attempt = pods[0]["metadata"]["labels"].get(C.LABEL_ATTEMPT, "?")
        rec.hit.append(f"{'/'.join(task_of(pods[0])[1:4])} attempt {attempt}")

    # the soak --------------------------------------------------------------------------------------

    def soak(self) -> None:
        self.t0 = _now()
        self.monitor = Monitor(self.api, self.config, self.t0).start()
        self.stack.callback(self.monitor.stop)
        self._done = threading.Event()
        injector = threading.Thread(target=self.inject_all, name="soak-faults", daemon=True)
        injector.start()
        try:
            self._drive(injector)
        finally:  # no fault may start a process after the stack has stopped everything
            self._done.set()
            injector.join(120)
        self.runs_done = _now()
        self.monitor.stop()

    def _drive(self, injector: threading.Thread) -> None:
        """Keep the lanes full until shortly before the soak time is over (until the faults are done,
        if later), then wait for every DAG run to end."""
        end = self.t0 + self.minutes * 60.0
        while _now() < end or injector.is_alive():
            self.refresh_runs()
            # a run started in the last seconds only lengthens the wait at the end; a fault still
            # waiting for its target (a gang bound) gets new runs
            if _now() < end - QUIET_TAIL_SECONDS or injector.is_alive():
                for dag_id, lanes in LANES.items():
                    while self.active(dag_id) < lanes:
                        self.trigger_soak(dag_id)
            time.sleep(2)
            if injector.is_alive() and _now() > end + 300:
                self._done.set()  # a fault waiting for a target gives up
        left = sum(r.state not in TERMINAL_RUN_STATES for r in self.soak_runs)
        self.say(f"soak time over ({self.minutes:g} min); no new runs; waiting for {left} DAG run(s) to finish")
        deadline = _now() + 900
        while True:
            self.refresh_runs()
            if all(r.state in TERMINAL_RUN_STATES for r in self.soak_runs):
                break
            if _now() > deadline:
                raise DemoFailed("DAG runs not finished 15 min after the soak: " + ", ".join(
                    f"{r.dag_id} {r.run_id} {r.state}" for r in self.soak_runs if r.state not in TERMINAL_RUN_STATES))
            time.sleep(3)

    # checks at the end ----------------------------------------------------------------------------

    def preempted_record(self) -> dict[str, object]:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        from airflow_gpu.kube.preemptions import read_record, record_name

        try:
            cm = client.CoreV1Api(self.api).read_namespaced_config_map(record_name(), C.DEFAULT_SCHEDULER_NAMESPACE)
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return read_record(self.api.sanitize_for_serialization(cm))

    def checkpoint_problem(self, uri: str, step: int) -> str | None:
        """None when a checkpoint of `step` in the store at `uri` is complete (manifest, objects,
        checksums), else why not."""
        from airflow_gpu.checkpoint import CheckpointStore
        from airflow_gpu.checkpoint.layout import parse_manifest_key

        with CheckpointStore(uri, **self.s3.client_options()) as store:
            keys = [k for k in store.manifest_keys() if (parse_manifest_key(k) or (None, None))[1] == step]
            if not keys:
                return f"no manifest of step {step} in {uri}"
            errors = []
            for key in keys:
                try:
                    store.check(store.load(key), "checksums")
                    return None
                except Exception as exc:  # noqa: BLE001 - reported as the violation
                    errors.append(f"{key}: {exc}")
            return f"step {step} in {uri} is incomplete: {'; '.join(errors)}"

    def report(self) -> dict:
        from airflow_gpu.kube.names import label_value

        violations = [asdict(v) for v in self.monitor.violations.values()]

        def violate(kind: str, detail: str) -> None:
            violations.append({"kind": kind, "detail": detail, "first": None, "last": None, "samples": 0})

        by_uid = self.monitor.pods
        for uid, entry in self.preempted_record().items():
            pod = by_uid.get(uid)
            if pod is not None and pod.task[1] in self.DAG_IDS:
                self.expected[pod.task]["preemptions"].add(pod.attempt)
        runs, retries_spent, attempts = [], 0, 0
        totals: Counter = Counter()
        for r in self.soak_runs:
            tis = self.task_instances(r.dag_id, r.run_id)
            row = {"dag_id": r.dag_id, "run_id": r.run_id, "state": r.state, "tasks": {}}
            runs.append(row)
            if r.state != "success":
                violate("DAG run failed", f"{r.dag_id} {r.run_id}: {r.state}")
            for ti in tis:
                key = ti["task_id"]
                result = (self.xcom(r.dag_id, ti["task_id"], ti["map_index"], run_id=r.run_id)
                          if ti["state"] == "success" else None)
                row["tasks"][key] = {"state": ti["state"], "try_number": ti["try_number"], "result": result}
                if ti["try_number"] > 1:
                    retries_spent += ti["try_number"] - 1
                    violate("retry spent", f"{r.dag_id} {r.run_id} {key}: Airflow try {ti['try_number']} "
                                           f"(state {ti['state']}); the trainer never fails on its own")
                if not isinstance(result, dict):
                    continue
                ns = next(t.namespace for t in self.config.teams if t.name == TEAM_OF[r.dag_id])
                task = (ns, label_value(r.dag_id), label_value(key), label_value(r.run_id), "-1")
                expected = {k: len(v) for k, v in self.expected[task].items()}
                got = {k: result.get(k, 0) for k in ("interruptions", "preemptions")}
                row["tasks"][key]["expected"] = expected
                for k in got:
                    totals[k] += got[k]
                attempts += result.get("attempts", 0)
                totals["attempts"] += result.get("attempts", 0)
                if got != expected:
                    violate("XCom counters", f"{r.dag_id} {r.run_id}: XCom {got}, the soak caused {expected}")
                if result.get("attempts") != 1 + got["interruptions"] + got["preemptions"]:
                    violate("XCom counters", f"{r.dag_id} {r.run_id}: {result.get('attempts')} attempts for "
                                             f"{got['interruptions']} interruption(s) + {got['preemptions']} preemption(s)")
                step = result.get("resumed_from_step")
                if got["interruptions"] + got["preemptions"] and step is None:
                    totals["resumed_from_start"] += 1
                if step is not None:
                    totals["resumed"] += 1
                    problem = self.checkpoint_problem(str(result["checkpoint_uri"]).split("/manifests/")[0], step)
                    if problem:
                        violate("resume from a partial save", f"{r.dag_id} {r.run_id}: {problem}")
        orphaned = self.orphans()
        for what, names in orphaned.items():
            for name in names:
                violate("orphan", f"{what[:-1]} {name}")
        faults = Counter(i.kind for i in self.injected if not i.error)
        return {
            "minutes": self.minutes, "seed": self.seed,
            "schedule": [asdict(f) for f in self.schedule],
            "faults": {k: faults.get(k, 0) for k in FAULT_KINDS},
            "faults_failed": [asdict(i) for i in self.injected if i.error],
            "injected": [asdict(i) for i in self.injected],
            "dag_runs": len(self.soak_runs),
            "dag_runs_by_state": dict(Counter(r.state for r in self.soak_runs)),
            "dag_runs_by_dag": dict(Counter(r.dag_id for r in self.soak_runs)),
            "attempts": totals["attempts"], "interruptions": totals["interruptions"],
            "preemptions": totals["preemptions"], "resumed_from_checkpoint": totals["resumed"],
            "retries_spent": retries_spent,
            "violations": violations,
            "violations_by_kind": dict(Counter(v["kind"] for v in violations)),
            "samples": self.monitor.samples, "samples_failed": self.monitor.failed_samples,
            "airflow_api_retries": self.rest_retries,
            "peak_team_gpus": dict(self.monitor.peak_team_gpus),
            "orphaned": orphaned,
            "runs": runs,
            "soak_seconds": round(self.runs_done - self.t0, 1),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }

    def show(self, report: dict) -> None:
        self.step("Soak outcome")
        t = Table("fault", "injected", "not injected", title=f"Faults (seed {report['seed']}, {report['minutes']:g} min)")
        failed = Counter(f["kind"] for f in report["faults_failed"])
        for kind in FAULT_KINDS:
            t.add_row(kind, str(report["faults"][kind]), str(failed.get(kind, 0)))
        self.console.print(t)
        t = Table("DAG runs", "succeeded", "attempts", "interruptions", "preemptions", "resumed from a checkpoint",
                  "retries spent", "samples", title="Work")
        t.add_row(str(report["dag_runs"]), str(report["dag_runs_by_state"].get("success", 0)), str(report["attempts"]),
                  str(report["interruptions"]), str(report["preemptions"]), str(report["resumed_from_checkpoint"]),
                  str(report["retries_spent"]), f"{report['samples']} ({report['samples_failed']} failed)")
        self.console.print(t)
        t = Table("invariant", "violations", title="Invariants")
        for kind in ("team above quota + borrowing", "node over-committed", "gang bound twice", "orphan",
                     "resume from a partial save", "retry spent", "XCom counters", "DAG run failed"):
            n = report["violations_by_kind"].get(kind, 0)
            t.add_row(kind, f"[{'red' if n else 'green'}]{n}[/]")
        self.console.print(t)
        for v in report["violations"]:
            self.console.print(f"[red]violation[/red] {v['kind']}: {escape(v['detail'])}"
                               + (f" (t={v['first']}..{v['last']} s, {v['samples']} samples)" if v["samples"] else ""))
        self.console.print(f"soak {report['soak_seconds']:.0f} s; load average {report['load_average']}")


def run(args: argparse.Namespace) -> int:
    console = Console(force_terminal=False, width=160)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="airflow-gpu-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    soak = Soak(workdir, console, args.minutes, args.seed)
    console.print(f"work dir {workdir}; seed {args.seed}; {args.minutes:g} minutes; fault schedule:")
    for f in soak.schedule:
        console.print(f"  t+{f.at:6.1f}s {f.kind}{f' {f.seconds:g}s' if f.seconds else ''}")

    def body() -> int:
        with soak.stack:
            soak.start_platform()
            soak.wait_for_dags()
            soak.soak()
            report = soak.report()
            soak.show(report)
            if args.json:
                args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
                console.print(f"report written to {args.json}")
            return 1 if report["violations"] or any(v == 0 for v in report["faults"].values()) else 0

    return run_by_pid(console, workdir, bool(args.workdir), "soak", body)
