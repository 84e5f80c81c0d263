"""`airflow-gpu demo` (`make demo`): the seed scenario (docs/DESIGN.md) through Airflow, end to end.

Everything is real and local, started and stopped by PID: SeaweedFS (S3, auth on), the local cluster
from examples/cluster-seed.yaml (A100 on-demand + MIG, spot pools, two zones), the GPU scheduler,
Airflow on SQLite (api-server, scheduler, dag-processor, triggerer; LocalExecutor) with the pools
synced from examples/seed-quotas.yaml. The example DAGs of dags/ are triggered through Airflow's REST
API for three teams; their GpuTrainingOperator tasks submit the gangs. The demo only watches, and
plays the cloud once: it interrupts the spot node under nlp's best-effort ablation mid-training.

    airflow-gpu demo [--headless] [--report FILE] [--keep-running] [--workdir DIR]

The options are parsed by the command line (cli/demo.py), which calls run(); this module imports
nothing from the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from airflow_gpu import constants as C
from airflow_gpu.airflow_api import AirflowApi

if TYPE_CHECKING:
    from airflow_gpu.kube.convert import ConversionContext

REPO_ROOT = Path(__file__).resolve().parents[1]
SEED_CLUSTER = REPO_ROOT / "examples" / "cluster-seed.yaml"
SEED_QUOTAS = REPO_ROOT / "examples" / "seed-quotas.yaml"
DAGS = REPO_ROOT / "dags"
BUCKET = "airflow-gpu-demo-{team}"  # one bucket per team, and an S3 identity limited to it
S3_SECRET = "s3-credentials"
ABLATION, FINETUNE, SWEEP = "nlp_ablation", "finetune_pipeline", "sweep_best_effort"
RECSYS = "recsys_two_generations"  # accepts H100 or A100: the report says on which it ran
DEMO_DAGS = (ABLATION, FINETUNE, SWEEP, RECSYS)
TERMINAL_RUN_STATES = ("success", "failed")


def _now() -> float:
    return time.time()


# --- what happens on the cluster, seen from outside ---------------------------------------------


@dataclass
class PodRecord:
    """One pod of an operator's gang, as the watcher saw it (times are epoch seconds, observed)."""

    namespace: str
    name: str
    dag_id: str
    task_id: str
    tier: str
    team: str
    attempt: str
    gang: str
    gpus: float
    mig: bool
    created: float
    bound: float | None = None
    node: str = ""
    capacity: str = ""
    product: str = ""  # the quota file's name of its node's GPU product ("" on a CPU node)
    disruption: str | None = None  # the DisruptionTarget condition's reason
    gone: float | None = None


@dataclass
class ClusterWatch:
    """Polls the team namespaces (pods, PodGroups) twice a second from a thread; main-thread readers
    take `events()` (new lines for the terminal) and the records for the report."""

    api: object
    namespaces: tuple[str, ...]
    gpus_total: float
    ctx: ConversionContext | None = None  # team and tier as the scheduler reads them (None: no quota config)
    pods: dict[str, PodRecord] = field(default_factory=dict)  # uid -> record
    wait_reasons: dict[str, list[str]] = field(default_factory=dict)  # PodGroup ns/name -> reasons seen
    samples: list[tuple[float, float]] = field(default_factory=list)  # (time, GPUs allocated)
    preemption_events: dict[str, str] = field(default_factory=dict)  # Event uid -> message (the scheduler's)
    _events: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def start(self) -> "ClusterWatch":
        self._thread = threading.Thread(target=self._run, name="cluster-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def events(self) -> list[str]:
        with self._lock:
            out, self._events = self._events, []
        return out

    def _say(self, text: str) -> None:
        self._events.append(text)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - shown by the main thread; the API may blink
                self.error = exc
            self._stop.wait(0.5)

    def poll(self) -> None:
        from kubernetes import client

        from airflow_gpu.kube.convert import ConversionContext, capacity_type_of, gang_identity, parse_time
        from airflow_gpu.ui.ledger import pod_gpus

        core, custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)
        nodes = {n["metadata"]["name"]: n for n in json.loads(core.list_node(_preload_content=False).data)["items"]}
        now = _now()
        seen: set[str] = set()
        newly_bound: list[PodRecord] = []
        with self._lock:
            for ns in self.namespaces:
                for pod in json.loads(core.list_namespaced_pod(ns, _preload_content=False).data)["items"]:
                    meta, labels = pod["metadata"], pod["metadata"].get("labels") or {}
                    if C.LABEL_DAG_ID not in labels:
                        continue
                    uid = meta["uid"]
                    seen.add(uid)
                    rec = self.pods.get(uid)
                    if rec is None:
                        requests = [c.get("resources") or {} for c in pod["spec"].get("containers", [])]
                        mig = any(k.startswith(C.RESOURCE_MIG_PREFIX) for r in requests
                                  for k in {**(r.get("requests") or {}), **(r.get("limits") or {})})
                        who = gang_identity(f"{ns}/{meta['name']}", None, [pod], self.ctx or ConversionContext())
                        rec = self.pods[uid] = PodRecord(
                            ns, meta["name"], labels[C.LABEL_DAG_ID], labels.get(C.LABEL_TASK_ID, ""),
                            who.tier, who.team,
                            labels.get(C.LABEL_ATTEMPT, ""), f"{ns}/{labels.get(C.LABEL_GANG, meta['name'])}",
                            pod_gpus(pod), mig, min(now, parse_time(meta.get("creationTimestamp")) or now))
                    node = pod["spec"].get("nodeName")
                    if node and rec.bound is None:
                        rec.bound, rec.node = now, node
                        node_labels = (nodes.get(node, {}).get("metadata") or {}).get("labels") or {}
                        rec.capacity = capacity_type_of(node_labels)
                        rec.product = self.product_name(node_labels.get(C.NODE_GPU_PRODUCT) or "")
                        newly_bound.append(rec)
                    reason = disruption_reason(pod)
                    if reason and rec.disruption is None:
                        rec.disruption = reason
                        self._say(f"[red]disrupted[/red] {rec.name} ({rec.team}, {rec.tier}) on {rec.node}: {reason}; "
                                  "SIGTERM, checkpoint, the operator resubmits the gang in the same try")
                for ev in json.loads(core.list_namespaced_event(ns, field_selector="reason=Preempted",
                                                                _preload_content=False).data)["items"]:
                    if ev["metadata"]["uid"] not in self.preemption_events:
                        self.preemption_events[ev["metadata"]["uid"]] = ev.get("message", "")
                        self._say(f"[red]preempted[/red] {ns}/{ev['involvedObject'].get('name')}: "
                                  f"{escape(ev.get('message', ''))}")
                for pg in custom.list_namespaced_custom_object(C.PODGROUP_GROUP, C.PODGROUP_VERSION, ns,
                                                              C.PODGROUP_PLURAL)["items"]:
                    reason = (pg["metadata"].get("annotations") or {}).get(C.ANNOTATION_WAIT_REASON)
                    key = f"{ns}/{pg['metadata']['name']}"
                    if reason and reason not in self.wait_reasons.setdefault(key, []):
                        self.wait_reasons[key].append(reason)
                        self._say(f"[yellow]waiting[/yellow] gang {key}: {escape(reason)}")
            for uid, rec in self.pods.items():
                if uid not in seen and rec.gone is None:
                    rec.gone = now
            for rec in newly_bound:
                self._announce_bound(rec)
            self.samples.append((now, sum(r.gpus for r in self.pods.values() if r.bound and r.gone is None)))

    def _announce_bound(self, rec: PodRecord) -> None:
        waited = rec.bound - rec.created
        if rec.mig:
            self._say(f"[green]inference on a MIG slice[/green]: {rec.name} ({rec.team}) on {rec.node} "
                      f"after {waited:.1f}s")
            return
        mates = [r for r in self.pods.values() if r.gang == rec.gang]
        if all(r.bound for r in mates) and rec is max(mates, key=lambda r: r.bound):
            where = ", ".join(sorted({f"{r.node} ({', '.join(x for x in (r.product, r.capacity) if x)})" for r in mates}))
            self._say(f"[green]gang bound[/green] {rec.dag_id}.{rec.task_id} attempt {rec.attempt} ({rec.team}, "
                      f"{rec.tier}, {sum(r.gpus for r in mates):g} GPUs) on {where}, {waited:.1f}s after submit")

    def product_name(self, label: str) -> str:
        """The quota file's product for a node's gpu.product label (the label itself if unnamed)."""
        names = {v: k for k, v in (self.ctx.product_labels if self.ctx else {}).items()}
        return names.get(label, label)

    # -- figures for the report ------------------------------------------------------------------

    def where_ran(self) -> dict[str, dict]:
        """Per GPU task (dag.task): the GPU products and nodes its gangs' GPU pods were bound to, over
        every attempt, and per gang the products (one each: a gang's GPU pods keep to one product)."""
        out: dict[str, dict] = {}
        for r in self.pods.values():
            if r.bound is None or not r.gpus:
                continue
            task = out.setdefault(f"{r.dag_id}.{r.task_id}", {"products": set(), "nodes": set(), "gangs": {}})
            task["products"].add(r.product)
            task["nodes"].add(r.node)
            task["gangs"].setdefault(r.gang, set()).add(r.product)
        return {k: {"products": sorted(v["products"]), "nodes": sorted(v["nodes"]),
                    "gangs": {g: sorted(p) for g, p in sorted(v["gangs"].items())}} for k, v in sorted(out.items())}

    def queue_waits(self) -> dict[str, dict[str, float]]:
        """Per tier: pod created (creationTimestamp, 1 s resolution) -> seen bound (0.5 s polls), per pod."""
        by_tier: dict[str, list[float]] = {}
        for r in self.pods.values():
            if r.bound is not None:
                by_tier.setdefault(r.tier, []).append(r.bound - r.created)
        return {tier: {"mean": round(statistics.fmean(v), 2), "p95": round(_p95(v), 2), "pods": len(v)}
                for tier, v in sorted(by_tier.items())}

    def utilisation_pct(self, since: float, until: float) -> float:
        """Allocated GPU-time / cluster GPU-time between `since` and `until` (step integral of the samples)."""
        pts = [(t, g) for t, g in self.samples if since <= t <= until]
        if len(pts) < 2 or until <= since:
            return 0.0
        area = sum(g0 * (t1 - t0) for (t0, g0), (t1, _) in zip(pts, pts[1:]))
        return round(100.0 * area / (self.gpus_total * (pts[-1][0] - pts[0][0])), 2)


def disruption_reason(pod: dict) -> str | None:
    from airflow_gpu.kube.state import disruption_target

    target = disruption_target(pod)
    return target[0] if target else None


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered) + 0.5) - 1))]


# --- the demo -------------------------------------------------------------------------------------


class DemoFailed(RuntimeError):
    pass


class Demo:
    DAGS_FOLDER = DAGS  # what the dag-processor parses
    DAG_IDS: tuple[str, ...] = DEMO_DAGS  # waited for before the story starts
    WATCH = True  # ClusterWatch: the story's terminal lines and the report's figures

    def __init__(self, workdir: Path, console: Console, headless: bool) -> None:
        self.workdir = workdir
        self.console = console
        self.headless = headless
        self.started = _now()
        self.stack = ExitStack()
        self.runs: dict[str, str] = {}  # dag_id -> run_id
        self.interrupted_node: str | None = None

    # infrastructure ----------------------------------------------------------------------------

    def say(self, text: str) -> None:
        self.console.print(f"[dim]{_now() - self.started:6.1f}s[/dim] {text}", highlight=False)

    def step(self, title: str) -> None:
        self.console.rule(f"[bold]{title}")

    def start_platform(self) -> None:
        from kubernetes import client

        from airflow_gpu.devtools.devplatform import start_platform
        from airflow_gpu.kube.convert import ConversionContext
        from airflow_gpu.ui.ledger import pod_gpus

        self.step("Starting the platform (everything on 127.0.0.1, stopped by PID at the end)")
        # `airflow-gpu dev up`'s platform, with the example DAGs and the demo's own settings
        def s3_endpoint(s3) -> str:  # the soak puts a cuttable proxy in front of S3 (s3_endpoint())
            self.s3 = s3
            return self.s3_endpoint()

        platform = start_platform(self.stack, self.workdir, self.DAGS_FOLDER, SEED_QUOTAS, SEED_CLUSTER,
                                  say=self.say, bucket=BUCKET, keep_airflow_env=False, log_level="WARNING",
                                  s3_endpoint=s3_endpoint, extra_env={
                                      C.ENV_EXAMPLE_CHECKPOINTS: f"s3://{BUCKET}/checkpoints",  # the DAGs fill in {team}
                                      C.ENV_EXAMPLE_S3_SECRET: S3_SECRET,
                                      # only the runs the demo triggers: finetune_pipeline's @daily schedule stays quiet
                                      "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
                                      "AIRFLOW__CORE__PARALLELISM": "8",
                                  })
        self.s3, self.cluster, self.scheduler, self.airflow = platform.s3, platform.cluster, platform.scheduler, \
            platform.airflow
        self.config = platform.config
        self.api = self.cluster.api_client()
        nodes = json.loads(client.CoreV1Api(self.api).list_node(_preload_content=False).data)["items"]
        self.gpus_total = sum(pod_gpus({"spec": {"containers": [{"resources": {"requests": n["status"]["allocatable"]}}]}})
                              for n in nodes)
        self.say(f"{len(nodes)} nodes, {self.gpus_total:g} GPUs (MIG slices as 1/7)")
        self.namespaces = tuple(t.namespace for t in self.config.teams)
        self.rest = self.airflow.api()
        self.stack.callback(self.rest.close)

        if self.WATCH:
            self.watch = ClusterWatch(self.api, self.namespaces, self.gpus_total,
                                      ConversionContext.from_config(self.config)).start()
            self.stack.callback(self.watch.stop)

    def s3_endpoint(self) -> str:
        """The S3 endpoint pods and Airflow workers are given (the soak puts a cuttable proxy there)."""
        return self.s3.endpoint_url

    # Airflow's REST API ------------------------------------------------------------------------

    def wait_for_dags(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        missing = set(self.DAG_IDS)
        while missing:
            errors = self.rest.request("GET", "/api/v2/importErrors")["import_errors"]
            if errors:
                raise DemoFailed("DAG import errors:\n" + "\n".join(f"{e['filename']}: {e['stack_trace']}" for e in errors))
            for dag_id in sorted(missing):
                if self.rest.request("GET", f"/api/v2/dags/{dag_id}", ok=(200, 404)).get("dag_id") == dag_id:
                    missing.discard(dag_id)
            if time.monotonic() > deadline:
                raise DemoFailed(f"DAGs {sorted(missing)} not parsed after {timeout:.0f}s:\n{self.airflow._tails()}")
            time.sleep(1)
        self.say(f"DAGs parsed by the dag-processor: {', '.join(self.DAG_IDS)}")

    def trigger(self, dag_id: str, note: str) -> None:
        run = self.rest.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": {}})
        self.runs[dag_id] = run["dag_run_id"]
        self.say(f"[bold]POST /api/v2/dags/{dag_id}/dagRuns[/bold] -> {run['dag_run_id']}: {note}")

    def run_state(self, dag_id: str, run_id: str | None = None) -> str:
        run_id = AirflowApi.quote(run_id or self.runs[dag_id])
        return self.rest.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]

    def task_instances(self, dag_id: str, run_id: str | None = None) -> list[dict]:
        run_id = AirflowApi.quote(run_id or self.runs[dag_id])
        return self.rest.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]

    def xcom(self, dag_id: str, task_id: str, map_index: int = -1, run_id: str | None = None):
        run_id = AirflowApi.quote(run_id or self.runs[dag_id])
        entry = self.rest.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/"
                                  "return_value", params={"map_index": map_index, "deserialize": True,
                                                          "stringify": False}, ok=(200, 404))
        value = (entry or {}).get("value")
        return json.loads(value) if isinstance(value, str) and value.startswith("{") else value

    # the story ---------------------------------------------------------------------------------

    def pump(self, seconds: float = 0.0, until=None, what: str = "", timeout: float = 300) -> None:
        """Print the cluster's news until `until()` is true (or for `seconds`)."""
        t0 = time.monotonic()
        status = None if self.headless else self.console.status(what or "working")
        if status:
            status.start()
        try:
            while True:
                for line in self.watch.events():
                    self.say(line)
                if until is not None and until():
                    return
                if until is None and time.monotonic() - t0 >= seconds:
                    return
                if time.monotonic() - t0 > timeout:
                    raise DemoFailed(f"{what}: not done after {timeout:.0f}s\n--- scheduler ---\n"
                                     f"{self.scheduler.log_tail(30)}\n{self.airflow._tails()}")
                for name, proc in self.airflow.processes.items():
                    if not proc.alive():
                        raise DemoFailed(f"airflow {name} died:\n{proc.log_tail()}")
                if status:
                    status.update(f"{what} | GPUs allocated {self._allocated():g}/{self.gpus_total:g}")
                time.sleep(0.5)
        finally:
            if status:
                status.stop()

    def _allocated(self) -> float:
        return self.watch.samples[-1][1] if self.watch.samples else 0.0

    def gang_pods(self, dag_id: str, task_id: str) -> list[PodRecord]:
        return [r for r in list(self.watch.pods.values()) if r.dag_id == dag_id and r.task_id == task_id]

    def gang_bound(self, dag_id: str, task_id: str, workers: int) -> bool:
        live = [r for r in self.gang_pods(dag_id, task_id) if r.gone is None and r.disruption is None]
        return len(live) >= workers and all(r.bound for r in live)

    def rank0_events(self, dag_id: str, task_id: str, event: str) -> list[dict]:
        """The trainer's JSON lines of kind `event` (train_numpy: start, resume, epoch, ...) in the log of
        the newest running rank 0; [] before it logs any."""
        from kubernetes import client

        rank0 = [r for r in self.gang_pods(dag_id, task_id) if r.name.endswith("-0") and r.bound and r.gone is None
                 and r.disruption is None]
        if not rank0:
            return []
        try:
            text = client.CoreV1Api(self.api).read_namespaced_pod_log(
                rank0[-1].name, rank0[-1].namespace, _preload_content=False).data.decode(errors="replace")
        except Exception as exc:  # noqa: BLE001 - the container may not have started yet
            self.last_log_error = exc
            return []
        prefix = f'{{"event": "{event}"'
        return [json.loads(x) for x in text.splitlines() if x.startswith(prefix)]

    def rank0_step(self, dag_id: str, task_id: str) -> int:
        """The newest checkpointed step in the log of the running rank 0, 0 before the first."""
        return max((e.get("step", 0) for e in self.rank0_events(dag_id, task_id, "epoch")), default=0)

    def try_number(self, dag_id: str, task_id: str) -> int:
        return next(ti["try_number"] for ti in self.task_instances(dag_id) if ti["task_id"] == task_id)

    def story(self) -> None:
        self.step("1. Best-effort work on spot (team nlp's ablation, 2 x 4 GPUs; team research's sweep, 3 x 2 GPUs)")
        self.trigger(ABLATION, "nlp, best-effort-training, 2 workers x 4 GPUs, checkpointed every epoch, spot")
        self.trigger(SWEEP, "research, best-effort-training, 3 mapped gangs x 2 GPUs, spot")
        self.trigger(RECSYS, "recsys, production-training, 2 x 4 GPUs accepting H100 or A100 (H100 first): both "
                             "workers on ONE product")
        self.pump(until=lambda: self.gang_bound(ABLATION, "ablation", 2) and self.rank0_step(ABLATION, "ablation") > 0,
                  what="the ablation bound and past its first checkpoint", timeout=240)

        self.step("2. The cloud takes a spot node back under the ablation, mid-training")
        node = next(r.node for r in self.gang_pods(ABLATION, "ablation") if r.gone is None and r.name.endswith("-0"))
        self.interrupted_node = node
        self.say(f"[bold]airflow-gpu cluster interrupt {node}[/bold] (2 s notice; a replacement joins after 10 s)")
        self.cluster.interrupt(node, notice=2.0, replace_after=10.0)
        first = {r.attempt for r in self.gang_pods(ABLATION, "ablation")}
        self.pump(until=lambda: self.gang_bound(ABLATION, "ablation", 2) and
                  {r.attempt for r in self.gang_pods(ABLATION, "ablation")} - first,
                  what="the ablation resubmitted by its operator (same try)", timeout=180)
        began: dict[str, list[dict]] = {}

        def began_training() -> bool:  # the trainer's first line: resume (from a checkpoint) or start
            began.update({e: self.rank0_events(ABLATION, "ablation", e) for e in ("resume", "start")})
            return any(began.values())

        self.pump(until=began_training, what="the resubmitted ablation reading its checkpoint", timeout=120)
        where = (f"from checkpoint step {began['resume'][-1]['step']}" if began["resume"]
                 else "from the start (no checkpoint found)")
        self.say(f"[green]resumed[/green] {ABLATION}.ablation {where}, in Airflow try "
                 f"{self.try_number(ABLATION, 'ablation')}: the interruption spent no retry")

        self.step("3. Production arrives: nlp's fine-tune takes the team's quota back by preemption")
        self.trigger(FINETUNE, "nlp, production-training, 2 x 4 GPUs on spot (opt-in), checkpointed; then eval on a MIG slice")

        self.step("4. Everything runs to the end")
        self.pump(until=self.all_runs_done, what="DAG runs to finish", timeout=480)
        for dag_id in DEMO_DAGS:
            self.say(f"DAG run {dag_id}: {self.run_state(dag_id)}")

    def all_runs_done(self) -> bool:
        return all(self.run_state(d) in TERMINAL_RUN_STATES for d in self.runs)

    # the outcome -------------------------------------------------------------------------------

    def orphans(self, timeout: float = 60.0) -> dict[str, list[str]]:
        """Pods, Services and PodGroups left in the team namespaces, after up to `timeout` for the
        operator's (asynchronous) deletions to complete."""
        from kubernetes import client

        core, custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)

        def left() -> dict[str, list[str]]:
            out: dict[str, list[str]] = {"pods": [], "services": [], "podgroups": []}
            for ns in self.namespaces:
                out["pods"] += [f"{ns}/{p.metadata.name}" for p in core.list_namespaced_pod(ns).items]
                out["services"] += [f"{ns}/{s.metadata.name}" for s in core.list_namespaced_service(ns).items]
                out["podgroups"] += [f"{ns}/{g['metadata']['name']}" for g in custom.list_namespaced_custom_object(
                    C.PODGROUP_GROUP, C.PODGROUP_VERSION, ns, C.PODGROUP_PLURAL)["items"]]
            return out

        deadline = time.monotonic() + timeout
        while True:
            found = left()
            if not any(found.values()) or time.monotonic() > deadline:
                return found
            time.sleep(1)

    def report(self) -> dict:
        runs_done = _now()
        dag_runs = {d: self.run_state(d) for d in DEMO_DAGS}
        tasks: dict[str, dict] = {}
        for dag_id in DEMO_DAGS:
            for ti in self.task_instances(dag_id):
                key = f"{dag_id}.{ti['task_id']}" + (f"[{ti['map_index']}]" if ti["map_index"] >= 0 else "")
                tasks[key] = {"state": ti["state"], "try_number": ti["try_number"]}
                if ti["operator"] == "GpuTrainingOperator" and ti["state"] == "success":
                    tasks[key]["result"] = self.xcom(dag_id, ti["task_id"], ti["map_index"])
        results = {k: v["result"] for k, v in tasks.items() if isinstance(v.get("result"), dict)}
        resumed = {k: {"step": r["resumed_from_step"], "try_number": tasks[k]["try_number"],
                       "interruptions": r["interruptions"], "preemptions": r["preemptions"]}
                   for k, r in results.items() if r.get("resumed_from_step")}
        pods = list(self.watch.pods.values())
        orphaned = self.orphans()
        since = datetime.fromtimestamp(self.started, timezone.utc).isoformat()
        rows = self.rest.request("GET", "/airflow-gpu/api/chargeback", params={"since": since})["rows"]
        chargeback: dict[str, dict] = {}
        for r in rows:
            team = chargeback.setdefault(r["team"], {"gpu_hours": 0.0, "cost": 0.0, "lost_interruption_hours": 0.0,
                                                     "lost_preemption_hours": 0.0})
            for k in team:
                team[k] = round(team[k] + (r[k] or 0.0), 6)  # cost None: a product without a price
        queue = self.rest.request("GET", "/airflow-gpu/api/queue")
        return {
            "dag_runs": dag_runs,
            "tasks": tasks,
            "interruptions": sum(r.get("interruptions", 0) for r in results.values()),
            "preemptions": sum(r.get("preemptions", 0) for r in results.values()),
            "interrupted_node": self.interrupted_node,
            "resumed_from_step": resumed,
            "preemption_events": sorted(self.watch.preemption_events.values()),
            "disrupted_pods": sorted(f"{r.namespace}/{r.name}: {r.disruption}" for r in pods if r.disruption),
            "wait_reasons": self.watch.wait_reasons,
            "queue_wait_seconds": self.watch.queue_waits(),
            "gpu_utilization_pct": self.watch.utilisation_pct(self.workload_started, runs_done),
            "gpu_utilization_definition": "GPUs bound to pods / cluster GPUs (MIG slices as 1/7), time-averaged "
                                          "from the first DAG run's trigger to the last run's end",
            "gpus_total": self.gpus_total,
            "mig_pods": sum(r.mig and r.bound is not None for r in pods),
            "where_ran": self.watch.where_ran(),
            "chargeback": chargeback,
            "chargeback_rows": rows,
            "cluster_allocation_ratio_at_end": queue["cluster"]["allocation_ratio"],
            "orphaned_objects": sum(len(v) for v in orphaned.values()),
            "orphaned": orphaned,
            "runs_seconds": round(runs_done - self.workload_started, 1),
            "total_seconds": round(_now() - self.started, 1),
        }

    def show(self, report: dict) -> None:
        self.step("Outcome")
        t = Table("DAG run", "state", title="DAG runs (triggered through the REST API)")
        for dag_id, state in report["dag_runs"].items():
            t.add_row(dag_id, Text(state, style="green" if state == "success" else "red"))
        self.console.print(t)
        t = Table("task", "state", "try", "attempts", "interruptions", "preemptions", "resumed from step",
                  "GPU-s", "lost GPU-s", title="GPU tasks (GpuTrainingOperator XCom)")
        for key, ti in report["tasks"].items():
            r = ti.get("result")
            if isinstance(r, dict):
                t.add_row(key, ti["state"], str(ti["try_number"]), str(r["attempts"]), str(r["interruptions"]),
                          str(r["preemptions"]), str(r["resumed_from_step"] if r["resumed_from_step"] is not None else "-"),
                          f"{r['gpu_seconds']:.0f}", f"{r['lost_gpu_seconds']:.0f}")
        self.console.print(t)
        t = Table("task", "GPU products", "nodes", title="Where the GPU tasks ran (every attempt)")
        for key, where in report["where_ran"].items():
            t.add_row(key, ", ".join(where["products"]), ", ".join(where["nodes"]))
        self.console.print(t)
        t = Table("tier", "pods", "mean s", "p95 s", title="Queue wait (submitted -> bound)")
        for tier, q in report["queue_wait_seconds"].items():
            t.add_row(tier, str(q["pods"]), f"{q['mean']:.1f}", f"{q['p95']:.1f}")
        self.console.print(t)
        t = Table("team", "GPU-hours", "cost USD", "lost to interruptions h", "lost to preemptions h",
                  title="Chargeback (the plugin's /airflow-gpu/api/chargeback)")
        for team, c in sorted(report["chargeback"].items()):
            t.add_row(team, f"{c['gpu_hours']:.4f}", f"{c['cost']:.4f}", f"{c['lost_interruption_hours']:.4f}",
                      f"{c['lost_preemption_hours']:.4f}")
        self.console.print(t)
        self.console.print(f"GPU allocation while the runs ran: {report['gpu_utilization_pct']:.1f} % of "
                           f"{report['gpus_total']:g} GPUs; MIG pods: {report['mig_pods']}; preemptions: "
                           f"{report['preemptions']}; interruptions: {report['interruptions']}; orphaned objects: "
                           f"{report['orphaned_objects']}; runs took {report['runs_seconds']:.0f}s")

    def check(self, report: dict) -> list[str]:
        """What `make demo` promises (issue 15's acceptance); the failures, empty when all hold."""
        problems = [f"DAG run {d} ended {s}" for d, s in report["dag_runs"].items() if s != "success"]
        if not any(r["step"] > 0 and r["try_number"] == 1 and r["interruptions"] >= 1
                   for r in report["resumed_from_step"].values()):
            problems.append("no interrupted task resumed from a step > 0 within try 1")
        if report["preemptions"] < 1:
            problems.append("no preemption")
        if report["mig_pods"] < 1:
            problems.append("no pod ran on a MIG slice")
        straddling = [g for w in report["where_ran"].values() for g, p in w["gangs"].items() if len(p) > 1]
        if straddling:
            problems.append(f"gangs bound across GPU products: {straddling}")
        if not report["where_ran"].get(f"{RECSYS}.train"):
            problems.append(f"{RECSYS}.train never ran")
        if report["orphaned_objects"]:
            problems.append(f"objects left behind: {report['orphaned']}")
        return problems


def _stop_on_signal(signum, frame) -> None:
    raise KeyboardInterrupt  # handled like Ctrl-C: the ExitStack stops every process by PID


def run_by_pid(console: Console, workdir: Path, keep_workdir: bool, what: str, body) -> int:
    """Run `body()` (which starts and stops the platform in an ExitStack) and return its exit code:
    SIGTERM and SIGHUP end it like Ctrl-C (130); DemoFailed is printed (1); the work dir is removed
    after a success unless `keep_workdir`."""
    for sig in (signal.SIGTERM, signal.SIGHUP):  # kill, or the terminal closed
        signal.signal(sig, _stop_on_signal)
    code = 0
    try:
        code = body()
    except KeyboardInterrupt:
        console.print("interrupted: everything was stopped by PID")
        code = 130
    except DemoFailed as exc:
        console.print(f"[red]{what} failed:[/red] {escape(str(exc))}", highlight=False)
        code = 1
    finally:
        if not keep_workdir and code == 0:
            shutil.rmtree(workdir, ignore_errors=True)
    return code


def run(args: argparse.Namespace) -> int:
    console = Console(force_terminal=None if not args.headless else False, width=160 if args.headless else None)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="airflow-gpu-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    console.print(f"work dir {workdir} (logs of every process are there)")
    demo = Demo(workdir, console, args.headless)

    def body() -> int:
        with demo.stack:
            demo.start_platform()
            demo.wait_for_dags()
            demo.workload_started = _now()
            demo.story()
            report = demo.report()
            demo.show(report)
            problems = demo.check(report)
            report["problems"] = problems
            if args.report:
                args.report.write_text(json.dumps(report, indent=2, default=str) + "\n")
                console.print(f"report written to {args.report}")
            for p in problems:
                console.print(f"[red]FAILED[/red] {p}")
            code = 1 if problems else 0
            console.print(f"\nAirflow UI: {demo.airflow.base_url}  (user {demo.airflow.username}, password "
                          f"{demo.airflow.password}); GPU queue page: {demo.airflow.base_url}/airflow-gpu/")
            if args.keep_running:
                console.print(f"Everything keeps running (kubeconfig {demo.cluster.kubeconfig}). Press Ctrl-C, or "
                              f"`kill -TERM {os.getpid()}`, to stop it all.")
                try:
                    while all(p.alive() for p in demo.airflow.processes.values()):
                        time.sleep(1)
                except KeyboardInterrupt:
                    pass  # the asked-for stop: the exit code stays the demo's
            demo.step("Stopping everything by PID")
        return code

    return run_by_pid(console, workdir, bool(args.workdir), "demo", body)
