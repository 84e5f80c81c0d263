"""`airflow-gpu cluster`: the local GPU cluster (a Kubernetes API on 127.0.0.1 with simulated GPU nodes).

  cluster up --spec FILE [--port N] [--state-dir DIR] [--token-file F] [--fsync] [--fresh] [--audit-log FILE]
      runs in the foreground; prints the kubeconfig path once the API answers; SIGTERM/SIGINT stop it
      and every pod process.
  cluster interrupt NODE [--notice S] [--replace-after S] [--mode eviction|shutdown] [--kubeconfig F]
  cluster not-ready NODE [--seconds S] / cluster ready NODE / cluster restart-apiserver
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from airflow_gpu import constants as C


def register(subparsers) -> None:
    parser = subparsers.add_parser("cluster", help="local GPU cluster: up, interrupt, not-ready, ready, restart-apiserver",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")

    up = sub.add_parser("up", help="run a local cluster in the foreground", allow_abbrev=False)
    up.add_argument("--spec", required=True, help="cluster spec YAML (see examples/cluster-*.yaml)")
    up.add_argument("--port", type=int, default=0, help="API server port on 127.0.0.1 (default: a free one)")
    up.add_argument("--state-dir", help="where state, pod working dirs and the kubeconfig go "
                                        "(default: ~/.cache/airflow-gpu/cluster-<spec name>)")
    up.add_argument("--token-file", help=f"require the bearer token in this file (else ${C.ENV_CLUSTER_TOKEN}, "
                                         "else none); never on the command line, where `ps` shows it")
    up.add_argument("--fsync", action="store_true",
                    help="fdatasync the store log before answering a write: answered writes also survive a "
                         "power cut (without it they survive a kill of the server)")
    up.add_argument("--bookmark-seconds", type=float, default=5.0, help="interval of watch BOOKMARK events")
    up.add_argument("--header-timeout", type=float, default=10.0,
                    help="close a connection that sends no complete request head within S seconds (slowloris)")
    up.add_argument("--max-connections", type=int, default=None,
                    help="open connections per listener; more are closed at once (default: 4096, less under a low "
                         "fd limit)")
    up.add_argument("--audit-log", help="write one audit.k8s.io/v1 Event per request to this file (JSON lines)")
    up.add_argument("--fresh", action="store_true",
                    help="start empty: delete the state dir's stored objects and pod dirs first "
                         "(without it a state dir's objects are restored and the spec adds no nodes)")
    up.set_defaults(func=_up)

    kube = argparse.ArgumentParser(add_help=False)
    kube.add_argument("--kubeconfig", help="kubeconfig of the cluster (default: $KUBECONFIG)")

    intr = sub.add_parser("interrupt", parents=[kube], help="spot-interrupt a node")
    intr.add_argument("node")
    intr.add_argument("--notice", type=float, default=120.0, help="seconds between the notice and SIGTERM (AWS: 120)")
    intr.add_argument("--replace-after", type=float, default=None, help="a replacement node joins after S seconds")
    intr.add_argument("--mode", choices=("eviction", "shutdown"), default="eviction",
                      help="eviction: Karpenter drains via the Eviction API; shutdown: graceful node shutdown")
    intr.set_defaults(func=_control)

    nr = sub.add_parser("not-ready", parents=[kube], help="a node's kubelet stops reporting")
    nr.add_argument("node")
    nr.add_argument("--seconds", type=float, default=None, help="recover after S seconds (default: stay NotReady)")
    nr.set_defaults(func=_control)

    rd = sub.add_parser("ready", parents=[kube], help="a NotReady node recovers")
    rd.add_argument("node")
    rd.set_defaults(func=_control)

    rs = sub.add_parser("restart-apiserver", parents=[kube], help="restart the API server, keeping its state")
    rs.add_argument("--down-seconds", type=float, default=0.5)
    rs.set_defaults(func=_control)


# the local cluster's own dependencies, which come with the `localcluster` extra (pyproject.toml):
# distribution -> what shows it is installed (a module, or dumb-init's program)
_EXTRA = {"websockets": "websockets", "pyjwt": "jwt", "pyseccomp": "pyseccomp", "dumb-init": "dumb-init"}


def missing_extra() -> str | None:
    """Why the local cluster cannot start here, or None: an image installed without the extra."""
    import importlib.util
    import os
    import shutil

    def present(dist: str, what: str) -> bool:
        if dist == "dumb-init":
            return bool(shutil.which(what, path=f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"))
        try:
            return importlib.util.find_spec(what) is not None
        except ImportError:
            return False

    missing = [dist for dist, what in _EXTRA.items() if not present(dist, what)]
    if missing:
        return (f"the local cluster needs {', '.join(missing)}, which come with the localcluster extra: "
                "pip install 'airflow-gpu[localcluster]'")
    return None


def _up(args) -> int:
    if problem := missing_extra():
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from airflow_gpu.localcluster.spec import SpecError, load_spec

    try:
        spec = load_spec(args.spec)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.header_timeout > 0 or (args.max_connections is not None and args.max_connections < 1):
        print(f"error: --header-timeout ({args.header_timeout}) must be > 0 and --max-connections "
              f"({args.max_connections}) >= 1", file=sys.stderr)
        return 2
    state_dir = Path(args.state_dir or Path.home() / ".cache" / "airflow-gpu" / f"cluster-{spec.name}")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    from airflow_gpu.cli.secrets import SecretError, read_secret
    from airflow_gpu.localcluster.cluster import StateDirBusy
    from airflow_gpu.localcluster.registry.store import CorruptLog

    try:
        args.token = read_secret(args.token_file, C.ENV_CLUSTER_TOKEN, "--token-file")
        return runner(_run(spec, state_dir, args))
    except (SecretError, CorruptLog) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except StateDirBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot serve on 127.0.0.1:{args.port}: {exc.strerror}; pick another --port", file=sys.stderr)
        return 1


async def _run(spec, state_dir: Path, args) -> int:
    from airflow_gpu.localcluster.cluster import LocalCluster

    cluster = LocalCluster(spec, state_dir, port=args.port, token=args.token, bookmark_seconds=args.bookmark_seconds,
                           fresh=args.fresh, audit_log=args.audit_log, fsync=args.fsync,
                           header_timeout=args.header_timeout, max_connections=args.max_connections)
    await cluster.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(cluster.kubeconfig_path, flush=True)
    print(f"local cluster {spec.name!r}: {cluster.server_url}, {len(cluster.store.values('/nodes'))} nodes, "
          f"state in {cluster.state_dir} (SIGTERM or Ctrl-C stops it)", file=sys.stderr, flush=True)
    await stop.wait()
    await cluster.stop()
    return 0


def _control(args) -> int:
    from airflow_gpu.localcluster import control

    try:
        if args.cluster_command == "interrupt":
            result = control.interrupt(args.node, args.notice, args.replace_after, args.mode, args.kubeconfig)
        elif args.cluster_command == "not-ready":
            result = control.not_ready(args.node, args.seconds, args.kubeconfig)
        elif args.cluster_command == "ready":
            result = control.ready(args.node, args.kubeconfig)
        else:
            result = control.restart_apiserver(args.down_seconds, args.kubeconfig)
    except control.ControlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    import json
    print(json.dumps(result))
    return 0
