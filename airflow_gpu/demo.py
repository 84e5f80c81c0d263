"""`make demo`: the seed scenario (docs/DESIGN.md) end to end on the local GPU cluster.

Everything is real and local: a SeaweedFS S3 server, the Kubernetes API emulator with the seed's
A100 nodes (on-demand, spot, MIG), the GPU scheduler, an Airflow metadata DB (SQLite) whose pools the
pool manager fills from the team quotas. Pods are submitted the way GpuTrainingOperator will submit
them (that operator is a later issue: until it lands this script plays its part, including the retry
after a spot interruption). Training pods run the example numpy trainer, which checkpoints to S3.

    python -m airflow_gpu.demo [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.table import Table

from airflow_gpu import constants as C
from airflow_gpu.kube import GangManifests, WorkloadSpec, build

REPO_ROOT = Path(__file__).resolve().parents[1]
SEED_CLUSTER = REPO_ROOT / "examples" / "cluster-seed.yaml"
SEED_QUOTAS = REPO_ROOT / "examples" / "seed-quotas.yaml"
BUCKET = "checkpoints"
S3_SECRET = "s3-credentials"

console = Console()


def step(title: str) -> None:
    console.rule(f"[bold]{title}")


def run(argv: list[str], env: dict | None = None, input: str | None = None) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, env=env, input=input, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({result.returncode}):\n{result.stderr}{result.stdout}")
    return result.stdout


def cli(*args: str, env: dict | None = None) -> str:
    return run([sys.executable, "-m", "airflow_gpu", *args], env=env)


# --- pods as the operator will build them (airflow_gpu.kube) ---------------------------------


def team_of(namespace: str) -> str:
    return namespace.removeprefix("team-")


def training_gang(name: str, namespace: str, tier: str, workers: int, gpus: int, *, spot: bool,
                  checkpoint_uri: str | None, attempt: int, epochs: int = 8) -> GangManifests:
    """A gang (PodGroup, headless Service, pods). Checkpointed ranks run the example trainer, each
    rank in its own store; S3 credentials come from a Kubernetes Secret, never from literals."""
    spec = WorkloadSpec(
        team=team_of(namespace), namespace=namespace, tier=tier, image="python:3.11", name=name,
        workers=workers, gpus_per_worker=gpus, attempt=attempt, interruptions=attempt - 1,
        capacity_type=C.CAPACITY_SPOT if spot else C.CAPACITY_ON_DEMAND,
        checkpoint_uri=checkpoint_uri, checkpoint_per_rank=checkpoint_uri is not None,
        s3_secret=S3_SECRET if checkpoint_uri else None,
        cmds=(sys.executable, "-m", "airflow_gpu.checkpoint.examples.train_numpy") if checkpoint_uri else (),
        env_vars={C.ENV_EXAMPLE_EPOCHS: str(epochs), C.ENV_EXAMPLE_STEP_SECONDS: "0.03"},
        annotations={} if checkpoint_uri else {C.ANNOTATION_SIM_DURATION: "600"},
        container_resources={"requests": {"cpu": "1", "memory": "2Gi"}}, termination_grace_period=20,
        container_name="trainer")
    return build(spec)


def inference_pod(name: str, namespace: str, profile: str, seconds: float) -> dict:
    """A lone pod on a MIG slice: no PodGroup, no Service, no gang labels."""
    spec = WorkloadSpec(
        team=team_of(namespace), namespace=namespace, tier=C.TIER_INFERENCE, image="vllm:latest", name=name,
        mig_profile=profile, gang=False, annotations={C.ANNOTATION_SIM_DURATION: str(seconds)},
        container_resources={"requests": {"cpu": "2", "memory": "8Gi"}}, container_name="serve")
    return build(spec).pods[0]


# --- the story ---------------------------------------------------------------------------------


class Demo:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started = time.monotonic()
        self.stack = ExitStack()
        self.notes: list[tuple[str, str]] = []
        self.results: dict = {}  # machine-readable outcomes (--summary-json), checked by tests/test_demo.py

    def __enter__(self) -> "Demo":
        return self

    def __exit__(self, *exc) -> None:
        step("Stopping everything by PID")
        self.stack.close()

    # infrastructure
    def start_s3(self) -> None:
        from airflow_gpu.devtools.seaweedfs import SeaweedFS

        step("S3 server (SeaweedFS on 127.0.0.1)")
        self.s3 = self.stack.enter_context(SeaweedFS(root=self.workdir / "s3"))
        self.s3.create_bucket(BUCKET)
        console.print(f"endpoint {self.s3.endpoint_url}, bucket {BUCKET!r}, auth on")

    def start_cluster(self) -> None:
        from airflow_gpu.devtools.kube import start_kube_cluster

        step(f"Local GPU cluster from {SEED_CLUSTER.name}")
        self.cluster = self.stack.enter_context(start_kube_cluster(self.workdir / "cluster", SEED_CLUSTER))
        self.api = self.cluster.api_client()
        console.print(f"kubeconfig {self.cluster.kubeconfig}")
        console.print(self.cluster.kubectl("get", "nodes", "-L", f"{C.NODE_CAPACITY_TYPE_KARPENTER},{C.NODE_ZONE}").stdout)

    def apply_quotas(self) -> None:
        step(f"Team quotas -> Namespaces, ResourceQuotas, PriorityClasses ({SEED_QUOTAS.name})")
        manifests = cli("pools", "render-k8s", "--config", str(SEED_QUOTAS))
        console.print(self.cluster.kubectl("apply", "-f", "-", input=manifests).stdout)
        from kubernetes import client

        core = client.CoreV1Api(self.api)
        for ns in ("team-research", "team-nlp"):
            core.create_namespaced_secret(ns, {"metadata": {"name": S3_SECRET}, "stringData": self.s3.env()})

    def sync_pools(self) -> None:
        step("Team quotas -> Airflow pools (SQLite metadata DB)")
        home = self.workdir / "airflow"
        home.mkdir(exist_ok=True)
        env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
               "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}"}
        run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=env)
        console.print(cli("pools", "sync", "--config", str(SEED_QUOTAS), env=env))
        console.print(cli("pools", "sync", "--config", str(SEED_QUOTAS), env=env).strip())

    def start_scheduler(self) -> None:
        from airflow_gpu.devtools.gangs import scheduler_process

        step("GPU scheduler (airflow-gpu scheduler)")
        self.scheduler = scheduler_process(self.cluster.kubeconfig, self.workdir / "scheduler.log",
                                           config_path=SEED_QUOTAS, identity="demo-scheduler").start()
        self.stack.callback(self.scheduler.stop)
        console.print(f"pid {self.scheduler.pid}, log {self.workdir / 'scheduler.log'}")

    # workloads
    def submit_gang(self, gang: GangManifests) -> None:
        from airflow_gpu.devtools.gangs import submit_gang

        submit_gang(self.api, gang)

    def pods(self, namespace: str, prefix: str = "") -> list[dict]:
        from airflow_gpu.devtools.gangs import list_pods

        return [p for p in list_pods(self.api, namespace) if p["metadata"]["name"].startswith(prefix)]

    def wait(self, what: str, predicate, timeout: float = 90.0) -> float:
        t0 = time.monotonic()
        with console.status(what):
            while not predicate():
                if time.monotonic() - t0 > timeout:
                    raise TimeoutError(f"{what}: not done after {timeout:.0f}s; scheduler log:\n{self.scheduler.log_tail()}")
                time.sleep(0.2)
        return time.monotonic() - t0

    @staticmethod
    def disrupted(pod: dict) -> bool:
        return any(c.get("type") == C.CONDITION_DISRUPTION_TARGET for c in pod.get("status", {}).get("conditions", []))

    def running(self, namespace: str, prefix: str, count: int) -> bool:
        pods = self.pods(namespace, prefix)
        return sum(p.get("status", {}).get("phase") == "Running" for p in pods) >= count

    def wait_reason(self, namespace: str, name: str) -> str:
        from airflow_gpu.devtools.gangs import get_podgroup

        pg = get_podgroup(self.api, namespace, name)
        return (pg["metadata"].get("annotations") or {}).get(C.ANNOTATION_WAIT_REASON, "")

    def where(self, namespace: str, prefix: str) -> str:
        return ", ".join(sorted({p["spec"].get("nodeName") or "-" for p in self.pods(namespace, prefix)}))

    def logs(self, namespace: str, pod: str) -> list[dict]:
        text = self.cluster.kubectl("logs", "-n", namespace, pod, check=False).stdout
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def checkpoint_status(self, uri: str) -> dict | None:
        from airflow_gpu.checkpoint import CheckpointStore

        with CheckpointStore(uri, **self.s3.client_options()) as store:
            return store.read_status()

    def story(self) -> None:
        uri = f"s3://{BUCKET}/team-research/sweep-lr"
        step("1. Best-effort sweep on spot (research, 2 x 4 GPUs, checkpoints every epoch to S3)")
        self.submit_gang(training_gang("sweep-lr", "team-research", C.TIER_BEST_EFFORT_TRAINING, 2, 4,
                                        spot=True, checkpoint_uri=uri, attempt=1, epochs=40))
        waited = self.wait("sweep gang bound and running", lambda: self.running("team-research", "sweep-lr", 2))
        self.notes.append(("sweep-lr started", f"{waited:.1f}s after submit on {self.where('team-research', 'sweep-lr')}"))

        step("2. Inference on MIG slices (serving, 6 x 1g.10gb)")
        for i in range(6):
            self.cluster.core().create_namespaced_pod("team-serving", inference_pod(f"score-{i}", "team-serving", "1g.10gb", 300))
        waited = self.wait("inference pods running", lambda: self.running("team-serving", "score-", 6))
        self.results["inference_nodes"] = self.where("team-serving", "score-")
        self.notes.append(("6 MIG inference pods", f"running after {waited:.1f}s on {self.where('team-serving', 'score-')}"))

        step("3. Production reclaims borrowed GPUs (two on-demand nodes in maintenance)")
        for node in ("a100-od-0", "a100-od-1"):
            self.cluster.kubectl("cordon", node)
        self.submit_gang(training_gang("vision-exp", "team-vision", C.TIER_BEST_EFFORT_TRAINING, 1, 8,
                                        spot=False, checkpoint_uri=None, attempt=1))
        self.wait("vision experiment running (its own quota)", lambda: self.running("team-vision", "vision-exp", 1))
        self.submit_gang(training_gang("sweep-wide", "team-research", C.TIER_BEST_EFFORT_TRAINING, 1, 8,
                                        spot=False, checkpoint_uri=None, attempt=1))
        self.wait("research sweep running on borrowed quota", lambda: self.running("team-research", "sweep-wide", 1))
        self.notes.append(("borrowing", f"research runs 16 GPUs on a quota of 8: sweep-wide on {self.where('team-research', 'sweep-wide')}"))
        self.submit_gang(training_gang("nlp-finetune", "team-nlp", C.TIER_PRODUCTION_TRAINING, 1, 8,
                                        spot=False, checkpoint_uri=None, attempt=1))
        waited = self.wait("production gang bound", lambda: self.running("team-nlp", "nlp-finetune", 1))
        survivors = {p["metadata"]["name"] for ns in ("team-research", "team-vision") for p in self.pods(ns)
                     if p.get("status", {}).get("phase") == "Running" and not self.disrupted(p)}
        victims = sorted({"vision-exp-0", "sweep-wide-0"} - survivors)
        self.results["preempted"] = victims
        self.results["production_node"] = self.where("team-nlp", "nlp-finetune")
        console.print(self.cluster.kubectl("get", "events", "-A", "--field-selector", "reason=Preempted").stdout)
        self.notes.append(("nlp-finetune (production)", f"bound {waited:.1f}s after submit on "
                           f"{self.where('team-nlp', 'nlp-finetune')}; preempted {victims or 'nothing'}"))

        step("4. Spot interruption of the sweep's node; retry resumes from the newest checkpoint")
        self.wait("sweep has a checkpoint", lambda: any(e["event"] == "epoch" for e in self.logs("team-research", "sweep-lr-0")), 60)
        node = self.pods("team-research", "sweep-lr-0")[0]["spec"]["nodeName"]
        console.print(f"interrupting {node} (2 s notice, as Karpenter does with AWS's 2-minute warning)")
        self.cluster.interrupt(node, notice=2.0)
        stopped: list[dict] = []

        def saved_and_ended() -> bool:
            # the pod's log says it saved on SIGTERM; read it while the pod is still there
            if not stopped:
                stopped.extend(e for e in self.logs("team-research", "sweep-lr-0") if e["event"] == "stopped")
            pods = self.pods("team-research", "sweep-lr")
            return all(p.get("status", {}).get("phase") in ("Failed", "Succeeded") for p in pods)

        self.wait("sweep saves a checkpoint on SIGTERM and ends", saved_and_ended, 90)
        status = self.checkpoint_status(f"{uri}/rank-0")  # the status channel the operator will mirror
        console.print(f"checkpoint status after the interruption: {json.dumps(status)}")
        if not stopped and status and status.get("stop_requested_at"):
            stopped.append({"event": "stopped", "step": status["step"], "source": "status.json"})
        from kubernetes import client

        core = client.CoreV1Api(self.api)
        for p in self.pods("team-research", "sweep-lr"):
            core.delete_namespaced_pod(p["metadata"]["name"], "team-research", grace_period_seconds=0)
        client.CustomObjectsApi(self.api).delete_namespaced_custom_object(
            C.PODGROUP_GROUP, C.PODGROUP_VERSION, "team-research", C.PODGROUP_PLURAL, "sweep-lr")
        core.delete_namespaced_service("sweep-lr", "team-research")
        self.wait("old attempt gone", lambda: not self.pods("team-research", "sweep-lr"), 60)
        self.submit_gang(training_gang("sweep-lr", "team-research", C.TIER_BEST_EFFORT_TRAINING, 2, 4,
                                        spot=True, checkpoint_uri=uri, attempt=2, epochs=40))
        self.wait("retry finished", lambda: any(e["event"] == "done" for e in self.logs("team-research", "sweep-lr-0")), 120)
        events = self.logs("team-research", "sweep-lr-0")
        resumed = next((e for e in events if e["event"] == "resume"), None)
        done = next(e for e in events if e["event"] == "done")
        self.results.update(stopped=stopped[0] if stopped else None, resumed=resumed, done=done)
        self.notes.append(("spot interruption", f"{node}: saved at {stopped[0] if stopped else 'no stop event'}"))
        self.notes.append(("retry (attempt 2)", f"resumed {json.dumps(resumed) if resumed else 'from scratch'}; done {json.dumps(done)}"))

    def summary(self) -> None:
        step("Summary")
        table = Table("what", "outcome")
        for what, outcome in self.notes:
            table.add_row(what, outcome)
        table.add_row("total demo time", f"{time.monotonic() - self.started:.0f}s")
        console.print(table)
        console.print("Not built yet: GpuTrainingOperator (this script plays its part), the UI page, "
                      "chargeback, the time-replay simulator.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_gpu.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, help="where state and logs go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir afterwards")
    parser.add_argument("--summary-json", type=Path, help="write the outcomes as JSON here")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="airflow-gpu-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    console.print(f"work dir {workdir}")
    try:
        with Demo(workdir) as demo:
            demo.start_s3()
            demo.start_cluster()
            demo.apply_quotas()
            demo.sync_pools()
            demo.start_scheduler()
            demo.story()
            demo.summary()
            if args.summary_json:
                args.summary_json.write_text(json.dumps(demo.results, indent=2))
    finally:
        if not (args.keep or args.workdir):
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
