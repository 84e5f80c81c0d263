"""`airflow-gpu scheduler`: the GPU scheduler for pods that name it in spec.schedulerName.

Exit codes: 0 stopped by SIGTERM/SIGINT; 2 bad input (config, kubeconfig, options).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

EXIT_BAD_INPUT = 2
USER_AGENT = "airflow-gpu-scheduler"


def register(subparsers) -> None:
    from airflow_gpu.constants import DEFAULT_SCHEDULER_NAME, DEFAULT_SCHEDULER_NAMESPACE, DEFAULT_SWITCH_INTERVAL

    p = subparsers.add_parser("scheduler", help="run the GPU scheduler (gangs, preemption, quotas) against a cluster")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--config", help="quota configuration YAML (teams, tiers, products); without it: no quotas")
    p.add_argument("--scheduler-name", default=DEFAULT_SCHEDULER_NAME, help="pods with this spec.schedulerName")
    p.add_argument("--policy", default=None,
                   help="placement policy (core.policies; default: the project's default, fgd-lookahead); "
                        "fgd policies learn the typical pods from the cluster's pods")
    p.add_argument("--publish-interval", type=float, default=None,
                   help="publish the queue (ConfigMap airflow-gpu-queue-<scheduler name> in the leader-elect "
                        "namespace, read by the UI and `airflow-gpu queue`) at most every this many seconds "
                        "(default 5), and when the set of waiting gangs changes")
    p.add_argument("--bind-workers", type=int, default=16, help="Bindings of one gang sent in parallel")
    p.add_argument("--switch-interval", type=float, default=None,
                   help="seconds the scheduling thread may keep the interpreter while the threads that wait on "
                        "the API (watches, Bindings, status writes) ask for it (sys.setswitchinterval; default "
                        f"{DEFAULT_SWITCH_INTERVAL:g}, Python's own 0.005)")
    p.add_argument("--kept-sweep-interval", type=float, default=60.0,
                   help="pods kept after their task (on_finish_action) are deleted at most this many seconds "
                        "after their keep-until time (default 60)")
    p.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus /metrics on this port (0: off)")
    p.add_argument("--metrics-address", default="127.0.0.1", help="address for --metrics-port")
    p.add_argument("--leader-elect", action=argparse_bool(), default=True,
                   help="take a coordination.k8s.io Lease before binding (default on; --no-leader-elect)")
    p.add_argument("--leader-elect-namespace", default=DEFAULT_SCHEDULER_NAMESPACE,
                   help="the scheduler's own namespace: its Lease and its plan records (ConfigMaps); "
                        "deploy/ passes the namespace it runs in")
    p.add_argument("--lease-name", default="airflow-gpu-scheduler", help="name of the Lease")
    p.add_argument("--identity", help="this replica's name in the Lease (default host-pid-random)")
    p.add_argument("--lease-duration", type=float, default=15.0, help="seconds")
    p.add_argument("--renew-deadline", type=float, default=10.0, help="seconds")
    p.add_argument("--retry-period", type=float, default=2.0, help="seconds")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=run)


def argparse_bool():
    import argparse

    return argparse.BooleanOptionalAction


def _api_client(args):
    from kubernetes import client, config

    try:
        if args.kubeconfig:
            cfg = client.Configuration()
            config.load_kube_config(config_file=args.kubeconfig, context=args.context, client_configuration=cfg)
        else:
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)
    except (config.ConfigException, OSError, TypeError, ValueError) as exc:
        where = args.kubeconfig or "in-cluster service account"
        raise SystemExit(f"scheduler: cannot load Kubernetes config from {where}: {exc} "
                         f"(give --kubeconfig FILE outside a cluster)") from None
    cfg.connection_pool_maxsize = 32  # binds run in parallel
    api = client.ApiClient(cfg)
    api.user_agent = USER_AGENT  # as kube components do: audit logs show who made each request
    return api


def run(args) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from airflow_gpu.config import ConfigError, load_config
    from airflow_gpu.core.policies import DEFAULT_POLICY, POLICIES
    from airflow_gpu.scheduler.actions import default_identity
    from airflow_gpu.scheduler.leader import LeaseElector
    from airflow_gpu.scheduler.loop import Scheduler, Settings
    from airflow_gpu.scheduler.metrics import SchedulerMetrics

    quota_config = None
    if args.config:
        try:
            quota_config = load_config(args.config)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return EXIT_BAD_INPUT
    args.policy = args.policy or DEFAULT_POLICY
    if args.policy not in POLICIES:
        print(f"scheduler: --policy {args.policy!r}: choose one of {', '.join(POLICIES)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.bind_workers < 1:
        print(f"scheduler: --bind-workers {args.bind_workers}: must be at least 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    from airflow_gpu.constants import DEFAULT_PUBLISH_INTERVAL, DEFAULT_SWITCH_INTERVAL

    switch = DEFAULT_SWITCH_INTERVAL if args.switch_interval is None else args.switch_interval
    if not 0 < switch <= 1:
        print(f"scheduler: --switch-interval {args.switch_interval}: must be > 0 and at most 1 second", file=sys.stderr)
        return EXIT_BAD_INPUT
    sys.setswitchinterval(switch)

    interval = DEFAULT_PUBLISH_INTERVAL if args.publish_interval is None else args.publish_interval
    if not interval > 0:
        print(f"scheduler: --publish-interval {args.publish_interval}: must be > 0 seconds", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not args.kept_sweep_interval > 0:
        print(f"scheduler: --kept-sweep-interval {args.kept_sweep_interval}: must be > 0 seconds", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        api_client = _api_client(args)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return EXIT_BAD_INPUT

    identity = args.identity or default_identity()
    elector = None
    if args.leader_elect:
        try:
            elector = LeaseElector(api_client, args.leader_elect_namespace, args.lease_name, identity,
                                   args.lease_duration, args.renew_deadline, args.retry_period)
        except ValueError as exc:
            print(f"scheduler: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    metrics = SchedulerMetrics()
    settings = Settings(scheduler_name=args.scheduler_name, policy=args.policy, bind_workers=args.bind_workers,
                        state_namespace=args.leader_elect_namespace, publish_interval=interval,
                        kept_sweep_interval=args.kept_sweep_interval)
    sched = Scheduler(api_client, quota_config, settings,
                      elector=elector, metrics=metrics, identity=identity)
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_address)

    def _stop(signum, _frame):
        logging.getLogger(__name__).info("signal %s: stopping", signum)
        threading.Thread(target=sched.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if elector is not None:
        elector.start()
    print(f"airflow-gpu scheduler {args.scheduler_name} as {identity}", flush=True)
    try:
        sched.run()
    finally:
        if elector is not None:
            elector.stop(release=True)
    return 0
