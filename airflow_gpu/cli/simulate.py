"""`airflow-gpu simulate`: trace simulation on the same core/ placement code as the scheduler.

    airflow-gpu simulate inflation --nodes CSV --pods CSV [--policy NAME] [--seed N] [--ratio 1.3]
                                   [--scale K] [--json] [--assignments FILE] [--bound] [--hold [F]]
    (no options: the policy the scheduler runs, as it runs it; --hold is an experiment, named in the output)
    airflow-gpu simulate replay (--pods CSV --nodes CSV | --trace CSV --nodes CSV [--team-map A=B,..]
                                [--tier-map A=B,..] | --seed-scenario) [--capacity F] [--seed N]
                                [--platforms a,b] [--jobs N] [--json] [--events DIR] [--plots DIR] [--report FILE]
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from pathlib import Path

from airflow_gpu.constants import DEFAULT_PLACEMENT_HOLD_SECONDS
from airflow_gpu.core.hold import EXPERIMENT_HOLD_FRACTION
from airflow_gpu.core.policies import DEFAULT_POLICY, POLICIES

ANCHOR_POINTS = (100, 110, 120, 130)


def register(subparsers) -> None:
    parser = subparsers.add_parser("simulate", help="replay a GPU trace through the placement policies")
    modes = parser.add_subparsers(dest="mode", required=True, metavar="MODE")
    inflation = modes.add_parser(
        "inflation",
        help="the FGD artifact's allocation experiment: arrive pods up to ratio x GPU capacity, no departures",
    )
    inflation.add_argument("--nodes", required=True, type=Path, help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
    inflation.add_argument("--pods", required=True, type=Path, help="pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli,...)")
    inflation.add_argument("--policy", default=DEFAULT_POLICY, choices=POLICIES,
                           help=f"placement policy (default {DEFAULT_POLICY}, the one the scheduler runs)")
    inflation.add_argument("--seed", type=int, default=42, help="shuffle/sampling/tie-order seed (the artifact uses 42..51)")
    inflation.add_argument("--ratio", type=float, default=1.3, help="arrived GPU demand as a multiple of capacity (default 1.3)")
    inflation.add_argument("--scale", type=int, default=1,
                           help="repeat the node list and the trace pods this many times (a cluster that many "
                                "times larger with the same mix; default 1)")
    inflation.add_argument("--hold", type=float, nargs="?", default=0.0, const=EXPERIMENT_HOLD_FRACTION,
                           metavar="FRACTION",
                           help="experiment, not run by the scheduler: held placements (core/hold.py: shares that "
                                "strand capacity stay provisional; a pod that fits nowhere may displace them) with "
                                "this budget as a fraction of GPU capacity (--hold alone: "
                                f"{EXPERIMENT_HOLD_FRACTION:g}); default 0: off, as the scheduler places; the "
                                "output names the experiment")
    inflation.add_argument("--hold-seconds", type=float, default=DEFAULT_PLACEMENT_HOLD_SECONDS, metavar="S",
                           help="with --hold: a pod stays held at most S s, pod k arriving at k / --arrival-rate s "
                                f"(default {DEFAULT_PLACEMENT_HOLD_SECONDS:g}, as simulate replay's --placement-hold-seconds; "
                                "inf: unbounded, the budget alone releases)")
    inflation.add_argument("--arrival-rate", type=float, default=None, metavar="PODS_PER_S",
                           help="with --hold: how arrival order maps to time (default: the trace's mean rate over "
                                "its creation_time column, openb default one pod per 1,583 s)")
    inflation.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    inflation.add_argument("--assignments", type=Path, help="write the final placement as CSV to this file")
    inflation.add_argument("--bound", action="store_true",
                           help="also report the upper bound on allocation for the arrived pods (MILP, sim/bound.py) "
                                "and the policy's gap to it in GPUs")
    inflation.set_defaults(func=_inflation)
    _register_replay(modes)


def _register_replay(modes) -> None:
    from airflow_gpu.sim.replay import PLATFORMS

    rp = modes.add_parser("replay", help="time replay of a trace on the scheduler's own cycle, naive vs full + ablations")
    src = rp.add_mutually_exclusive_group(required=True)
    src.add_argument("--pods", type=Path, help="openb pod list CSV (with creation/deletion times and qos)")
    src.add_argument("--trace", type=Path,
                     help="generic job CSV (job,submit_time,duration[,workers,gpus_per_worker|gpu_milli,team,tier,"
                          "products,checkpointable]; docs/replay-traces.md)")
    src.add_argument("--seed-scenario", action="store_true", help="the design's seed example (generated)")
    rp.add_argument("--nodes", type=Path, help="node list CSV, openb's format: sn,cpu_milli,memory_mib,gpu,model "
                                               "(with --pods or --trace)")
    rp.add_argument("--team-map", metavar="FROM=TO,...",
                    help="--trace: trace team -> quota file team ('*=TEAM': every other unknown team); unmapped "
                         "unknown teams are spread over the file's teams by a seeded hash (docs/replay-traces.md)")
    rp.add_argument("--tier-map", metavar="FROM=TO,...",
                    help="--trace: trace tier (Slurm QOS, PriorityClass) -> quota file tier ('*=TIER'); unmapped "
                         "unknown tiers run as the file's lowest-priority preemptible tier")
    rp.add_argument("--capacity", type=float, default=1.0, help="keep this seeded fraction of the nodes (0, 1]")
    rp.add_argument("--spot-share", type=float, default=None, metavar="FRACTION",
                    help="seeded fraction of the nodes that are spot (interrupted, cheaper) on the platforms with "
                         "spot; default: 0 for --trace (your node list as it is), 0.25 for --pods, the generator's "
                         "for --seed-scenario")
    rp.add_argument("--seed", type=int, default=42, help="seed of capacity, teams, spot and the generator")
    rp.add_argument("--days", type=float, help="seed scenario: days of arrivals (default from SeedParams)")
    rp.add_argument("--config", type=Path, help="quota config for tiers and prices (default examples/seed-quotas.yaml)")
    rp.add_argument("--platforms", default=",".join(n for n in PLATFORMS if n != "no-hold"),
                    help=f"comma-separated, from {', '.join(PLATFORMS)} (default: all but no-hold, which is full "
                         "unless placements are held)")
    rp.add_argument("--duration-estimate", type=float, default=0.0, metavar="X",
                    help="give the queue each gang's expected duration = X x its work (EASY backfilling through "
                         "reservations); 0 (default): none, like gangs without the expected-duration annotation; "
                         "1 is an oracle")
    rp.add_argument("--reservation-hold", type=float, default=None, metavar="S",
                    help="a reservation of unknown start holds its nodes at most S s in a row, then pauses S s "
                         "(core.reservation.ReservationHold); 0: unbounded (default: the config's "
                         "scheduling.reservation_hold_seconds, as the scheduler runs it)")
    rp.add_argument("--placement-hold", type=float, default=None, metavar="FRACTION",
                    help="held placements (core/holding.py): at most this fraction of the GPU capacity held, a "
                         "share that strands capacity reserved and not bound; an experiment, not run by the scheduler "
                         "(default 0: off); the platform no-hold is full without them")
    rp.add_argument("--placement-hold-seconds", type=float, default=None, metavar="S",
                    help="a held pod is bound where it was reserved after at most S s (default "
                         f"{DEFAULT_PLACEMENT_HOLD_SECONDS:g})")
    rp.add_argument("--restart-overhead", type=float, default=None, metavar="S",
                    help="every tier's restart overhead: seconds each restart computes nothing, charged as lost "
                         "(default: the config's scheduling/tier restart_overhead_seconds, as the scheduler runs it)")
    rp.add_argument("--min-runtime", default=None, metavar="TIER=S[,TIER=S]",
                    help="minimum runtime before preemption per tier, replacing the config's tiers' "
                         "min_runtime_seconds ('' or 'none': none)")
    rp.add_argument("--max-wait", default=None, metavar="TIER=S[,TIER=S]",
                    help="wait bounds per tier, replacing the config's tiers' max_wait_seconds ('' or 'none': "
                         "none, strict priority order), e.g. production-training=0,best-effort-training=14400")
    rp.add_argument("--estimates", default="learned", choices=("learned", "runs", "declared", "off"),
                    help="record the estimated start the scheduler would publish for every waiting gang (at "
                         "submission and hourly) against its real start (sim/start_accuracy.py): 'learned' (default) "
                         "as the scheduler: run lengths learned from the gangs that left and the stretch learned "
                         "from earlier estimates; 'runs': run lengths only; 'declared': declared durations only; "
                         "'off': not recorded (faster)")
    rp.add_argument("--error-table", type=Path, metavar="FILE",
                    help="write the full platform's per-tier estimate error (p90, seconds) as a quota-file "
                         "`scheduling.estimate_error_seconds` snippet (YAML) for the queue page's intervals")
    rp.add_argument("--jobs", type=int, default=None, metavar="N",
                    help="replay the platforms in N processes (default: one per CPU; 1: one after another)")
    rp.add_argument("--json", action="store_true", help="print one JSON object")
    rp.add_argument("--events", type=Path, help="write <platform>.csv (every job attempt) and quota JSON here")
    rp.add_argument("--plots", type=Path, help="write utilization.png, wait_cdf.png, ablations.png here")
    rp.add_argument("--report", type=Path, help="write a markdown report to this file")
    rp.set_defaults(func=_replay)


def _replay(args) -> int:
    from airflow_gpu.sim.replay import PLATFORMS
    from airflow_gpu.sim.replay_report import markdown, plot, summarize, write_events
    from airflow_gpu.sim.jobtrace import parse_map
    from airflow_gpu.sim.settings import DEFAULT_CONFIG, openb_setting, seed_setting, trace_setting
    from airflow_gpu.sim.traces import TraceError, trace_name
    from airflow_gpu.sim.workload import SeedParams

    names = [n.strip() for n in args.platforms.split(",") if n.strip()]
    unknown = [n for n in names if n not in PLATFORMS]
    if unknown or not names:
        print(f"--platforms: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(PLATFORMS)}",
              file=sys.stderr)
        return 2
    if not 0 < args.capacity <= 1:
        print(f"--capacity must be in (0, 1], got {args.capacity}", file=sys.stderr)
        return 2
    if args.duration_estimate < 0:
        print(f"--duration-estimate must be >= 0 (0: no estimate), got {args.duration_estimate}", file=sys.stderr)
        return 2
    if args.jobs is not None and args.jobs < 1:
        print(f"--jobs must be >= 1 (1: one platform after another), got {args.jobs}", file=sys.stderr)
        return 2
    if args.reservation_hold is not None and args.reservation_hold < 0:
        print(f"--reservation-hold must be >= 0 (0: unbounded), got {args.reservation_hold}", file=sys.stderr)
        return 2
    if (args.placement_hold is not None and not 0 <= args.placement_hold <= 1) or \
            (args.placement_hold_seconds is not None and not args.placement_hold_seconds > 0):
        print(f"--placement-hold must be in [0, 1] (a fraction of the GPU capacity) and --placement-hold-seconds "
              f"> 0, got {args.placement_hold} and {args.placement_hold_seconds}", file=sys.stderr)
        return 2
    try:
        min_runtime = parse_tier_seconds(args.min_runtime)
    except ValueError as exc:
        print(f"--min-runtime: {exc}", file=sys.stderr)
        return 2
    try:
        max_wait = parse_tier_seconds(args.max_wait)
    except ValueError as exc:
        print(f"--max-wait: {exc}", file=sys.stderr)
        return 2
    for option, path in (("--events", args.events), ("--plots", args.plots)):
        if path is not None and path.exists() and not path.is_dir():
            print(f"{option} {path}: is a file; give a directory (it gets one file per platform)", file=sys.stderr)
            return 2
    if args.spot_share is not None and not 0 <= args.spot_share <= 1:
        print(f"--spot-share must be in [0, 1] (a fraction of the nodes), got {args.spot_share}", file=sys.stderr)
        return 2
    if args.restart_overhead is not None and args.restart_overhead < 0:
        print(f"--restart-overhead must be >= 0 seconds, got {args.restart_overhead}", file=sys.stderr)
        return 2
    config = args.config or DEFAULT_CONFIG
    params = mapped = None
    try:
        if args.seed_scenario:
            params = SeedParams() if args.days is None else SeedParams(days=args.days)
            setting = seed_setting(params, args.seed, config)
            if args.capacity < 1:
                from dataclasses import replace as _replace

                from airflow_gpu.sim.workload import keep_capacity
                setting = _replace(setting, nodes=tuple(keep_capacity(list(setting.nodes), args.capacity, args.seed)))
            trace = "seed-scenario"
        elif args.trace is not None:
            if args.nodes is None:
                print("--trace needs --nodes (the node list CSV)", file=sys.stderr)
                return 2
            setting, mapped = trace_setting(args.nodes, args.trace, args.capacity, args.seed, config,
                                            parse_map(args.team_map, "--team-map"),
                                            parse_map(args.tier_map, "--tier-map"))
            trace = trace_name(args.trace)
        else:
            if args.nodes is None:
                print("--pods needs --nodes (the node list CSV)", file=sys.stderr)
                return 2
            setting = openb_setting(args.nodes, args.pods, args.capacity, args.seed, config)
            trace = trace_name(args.pods)
        if (args.team_map or args.tier_map) and args.trace is None:
            print("--team-map and --tier-map apply to --trace only", file=sys.stderr)
            return 2
    except (TraceError, ValueError) as exc:
        print(f"airflow-gpu simulate replay: {exc}", file=sys.stderr)
        return 2

    from dataclasses import replace as _with

    setting = _with(setting, duration_estimate=args.duration_estimate, estimates=args.estimates)
    if args.spot_share is not None:
        setting = _with(setting, spot=_with(setting.spot, share=args.spot_share))
    if args.reservation_hold is not None:
        setting = _with(setting, reservation_hold=args.reservation_hold)
    if args.placement_hold is not None:
        setting = _with(setting, placement_hold=args.placement_hold)
    if args.placement_hold_seconds is not None:
        setting = _with(setting, placement_hold_seconds=args.placement_hold_seconds)
    from airflow_gpu.sim.settings import with_restart_cost, with_wait_bounds

    setting = with_restart_cost(setting, args.restart_overhead, min_runtime)
    try:
        setting = with_wait_bounds(setting, max_wait)
    except ValueError as exc:
        print(f"--max-wait: {exc}", file=sys.stderr)
        return 2
    _say_what_runs(trace, setting, names, args.jobs, mapped)
    results = replay_showing_progress(setting, names, args.jobs)
    doc = {"trace": trace, "capacity": args.capacity, "seed": args.seed, "duration_estimate": args.duration_estimate,
           "reservation_hold": setting.reservation_hold, "estimates": args.estimates,
           "placement_hold": setting.placement_hold, "placement_hold_seconds": setting.placement_hold_seconds,
           "restart_overhead": {t: tier.restart_overhead_seconds for t, tier in setting.tiers.items()},
           "min_runtime": dict(setting.preemption_policy.min_runtime),
           "max_wait": {t: tier.max_wait_seconds for t, tier in setting.tiers.items()
                        if tier.max_wait_seconds is not None},
           "spot_share": setting.spot.share,
           "nodes": len(setting.nodes), "gpus": sum(n.gpu_count for n in setting.nodes), "jobs": len(setting.jobs),
           "left_out": setting.left_out,  # job -> why it can never start on these nodes
           "source_notes": list(setting.notes),  # what reading the source dropped
           "platforms": {r.platform.name: summarize(r) for r in results}}
    if params is not None:
        doc["parameters"] = params.describe()
    if mapped is not None:  # how the trace's teams and tiers were read: the what-if is only as good as this
        doc["mapping"] = {"teams": mapped.teams, "tiers": mapped.tiers, "shares": setting.teams}
    if args.events:
        for r in results:
            write_events(r, args.events)
    if args.plots:
        plot(results, doc["platforms"], args.plots)
    if args.error_table:
        from airflow_gpu.sim.start_accuracy import error_table_yaml

        full = doc["platforms"].get("full") or next(iter(doc["platforms"].values()))
        args.error_table.parent.mkdir(parents=True, exist_ok=True)
        args.error_table.write_text(error_table_yaml(full.get("estimated_start_error") or {}, doc))
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(markdown(doc))
    if args.json:
        print(json.dumps(doc))
    else:
        print(markdown(doc), end="")
    return 0


def _count(n: int, word: str, plural: str = "s") -> str:
    return f"{n:,} {word}{plural if n != 1 else ''}"


def _say_what_runs(trace: str, setting, names: list[str], jobs: int | None, mapped) -> None:
    """On stderr, before minutes of work: what is replayed, what reading the source left out or
    assumed, and the trace's teams and tiers that only a fallback rule placed (a trace whose tiers
    are all unknown runs as one preemptible tier: a what-if of preemption then has nothing to preempt)."""
    import os

    gpus = sum(n.gpu_count for n in setting.nodes)
    procs = min(jobs or os.cpu_count() or 1, len(names))
    lines = [f"replay {trace}: {_count(len(setting.jobs), 'job')} on {_count(len(setting.nodes), 'node')} "
             f"({gpus} GPUs); {', '.join(names)} in {_count(procs, 'process', 'es')}"]
    lines += [f"  {line}" for line in _setting_lines(setting, names) + _mapping_lines(mapped)]
    for line in lines:
        print(line, file=sys.stderr, flush=True)


def _setting_lines(setting, names: list[str]) -> list[str]:
    """Spot on the platforms that have it, and what reading the source left out."""
    from airflow_gpu.sim.replay import PLATFORMS

    out = []
    spot = [n for n in names if PLATFORMS[n].spot]
    if spot:
        said = (f"{100 * setting.spot.share:g} % of the nodes are spot, interrupted "
                f"{setting.spot.interruptions_per_node_day:g} times a node-day" if setting.spot.share
                else "no node is spot, so spot is not exercised")
        out.append(f"on {', '.join(spot)}: {said} (--spot-share to choose)")
    out += list(setting.notes)
    left = setting.left_out
    if left:
        shown = "; ".join(f"{name}: {why}" for name, why in list(left.items())[:5])
        more = f"; and {len(left) - 5:,} more" if len(left) > 5 else ""
        out.append(f"{_count(len(left), 'job')} can never start on these nodes and {'are' if len(left) != 1 else 'is'} "
                   f"left out (the JSON's left_out lists all): {shown}{more}")
    return out


def _mapping_lines(mapped) -> list[str]:
    """How a --trace was read: tiers a team may not submit, unknown node models, the origin, and
    the teams and tiers only a fallback rule placed."""
    if mapped is None:
        return []
    out = []
    if mapped.disallowed:
        pairs = "; ".join(f"{team} / {tier}: {n:,}" for (team, tier), n in sorted(mapped.disallowed.items()))
        out.append(f"jobs mapped to a tier their team's `tiers` do not allow (the cluster's ResourceQuota would refuse "
                   f"their pods; replayed all the same): {pairs} (--team-map or --tier-map to choose)")
    if mapped.unknown_models:
        out.append(f"node models the quota file has no product for (name or node_label): "
                   f"{', '.join(sorted(mapped.unknown_models))}; priced as its first product, at relative speed 1.0")
    if mapped.origin:
        out.append(f"submit times counted from the first submission (submit_time {mapped.origin:,.0f}): the replay's 0")
    for word, applied, guessed, option, rule in (
            ("teams", mapped.teams, mapped.guessed_teams, "--team-map", "spread over its teams by a seeded hash"),
            ("tiers", mapped.tiers, mapped.guessed_tiers, "--tier-map", "its lowest-priority preemptible tier")):
        by_target: dict[str, list[str]] = {}
        for name in guessed - {""}:
            by_target.setdefault(applied[name], []).append(name)
        pairs = [f"{', '.join(sorted(f))} -> {to}" for to, f in sorted(by_target.items())]
        if "" in guessed:  # rows without one: per job (teams) or one default (tiers)
            pairs.append(f"none given -> {applied['']}")
        if pairs:
            out.append(f"trace {word} not in the quota file, {rule}: {'; '.join(pairs)} ({option} to choose)")
    return out


class _ProgressLines:
    """Progress off a terminal (a CI log, `2> file`): one line per platform at most every `every`
    seconds, and one when it is over, on stderr."""

    def __init__(self, names: list[str], every: float = 30.0):
        self.t0, self.every = time.monotonic(), every
        self.last = {n: self.t0 for n in names}
        self.over: set[str] = set()

    def __call__(self, name: str, done: int, total: int) -> None:
        now = time.monotonic()
        elapsed = now - self.t0
        if done >= total and name not in self.over:
            self.over.add(name)
            print(f"replay {name}: over in {_clock(elapsed)}", file=sys.stderr, flush=True)
        elif done < total and now - self.last[name] >= self.every:
            self.last[name] = now
            left = f", ~{_clock(elapsed * (total - done) / done)} left" if done else ""
            print(f"replay {name}: {done:,} of {total:,} jobs started ({100 * done / total:.0f} %) in "
                  f"{_clock(elapsed)}{left}", file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def replay_showing_progress(setting, names: list[str], jobs: int | None):
    """sim.replay.replay_platforms with a bar per platform on a terminal, else a line per platform
    every 30 s (minutes of work on a long trace); `python -m bench replay_80k` shows the same.
    Progress is jobs started of the trace's jobs."""
    from airflow_gpu.sim.replay import replay_platforms

    if not sys.stderr.isatty():
        return replay_platforms(setting, names, jobs, progress=_ProgressLines(names))
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        tasks = {name: bar.add_task(name, total=None) for name in names}
        return replay_platforms(setting, names, jobs,
                                progress=lambda n, d, t: bar.update(tasks[n], completed=d, total=t))


def parse_tier_seconds(text: str | None) -> dict[str, float] | None:
    """'best-effort-training=600,inference=60' -> {tier: seconds}; None: not given; '' or 'none': {}."""
    if text is None:
        return None
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if part.lower() == "none":
            continue
        tier, sep, value = part.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not sep or not tier.strip() or not 0 <= seconds < float("inf"):
            raise ValueError(f"{part!r}: give TIER=SECONDS, e.g. best-effort-training=600")
        out[tier.strip()] = seconds
    return out


def _inflation(args) -> int:
    from airflow_gpu.sim.inflation import run_inflation, scaled, trace_arrival_rate
    from airflow_gpu.sim.traces import TraceError, load_nodes, load_pods, trace_name

    if not 0 <= args.hold <= 1:
        print(f"--hold must be in [0, 1] (a fraction of the GPU capacity), got {args.hold}", file=sys.stderr)
        return 2
    if not args.hold_seconds > 0 or (args.arrival_rate is not None and not args.arrival_rate > 0):
        print(f"--hold-seconds ({args.hold_seconds}) and --arrival-rate ({args.arrival_rate}) must be > 0",
              file=sys.stderr)
        return 2
    if not 0 < args.ratio <= 10:
        print(f"--ratio must be in (0, 10], got {args.ratio}; the artifact uses 1.3", file=sys.stderr)
        return 2
    try:
        nodes = load_nodes(args.nodes)
        trace = load_pods(args.pods)
        nodes, pods = scaled(nodes, [p.request for p in trace], args.scale)
    except (TraceError, ValueError) as exc:
        print(f"airflow-gpu simulate: {exc}", file=sys.stderr)
        return 2
    rate = args.arrival_rate or trace_arrival_rate([p.creation_time for p in trace], args.scale)
    if args.hold and rate is None and not math.isinf(args.hold_seconds):
        print(f"--hold-seconds {args.hold_seconds:g} needs an arrival rate: {args.pods} has no creation_time "
              "span; give --arrival-rate PODS_PER_S or --hold-seconds inf", file=sys.stderr)
        return 2
    hold = {"hold": args.hold, "hold_seconds": args.hold_seconds, "arrival_rate": rate}

    if sys.stderr.isatty():
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task(f"{args.policy} seed {args.seed}", total=None)
            result = run_inflation(
                nodes, pods, args.policy, args.seed, args.ratio,
                progress=lambda done, total: bar.update(task, completed=done, total=total), **hold,
            )
    else:
        result = run_inflation(nodes, pods, args.policy, args.seed, args.ratio, **hold)

    if args.assignments:
        write_assignments(args.assignments, result.placements)
    summary = {
        "policy": args.policy,
        "trace": trace_name(args.pods),
        "nodes": trace_name(args.nodes),
        "seed": args.seed,
        "ratio": args.ratio,
        "scale": args.scale,
        "gpu_allocation_pct": round(result.gpu_allocation_pct, 4),
        "allocation_at_pct": {str(x): round(result.allocation_at(x), 4) for x in ANCHOR_POINTS},
        "curve": result.curve(),
        "unallocated_gpus": round(result.unallocated_gpus, 3),
        "total_gpus": result.total_gpu_milli // 1000,
        "pods": len(result.pods),
        "placed_pods": len(result.placements),
        "failed_pods": len(result.failed_pods),
        "hold": result.hold,
        "hold_seconds": (None if math.isinf(result.hold_seconds) else result.hold_seconds) if result.hold else None,
        "arrival_rate": result.arrival_rate if result.hold else None,
        "experiment": result.experiment,  # None: the scheduler's own placement
        "displaced_pods": result.displaced,
        "seconds": round(result.seconds, 3),
    }
    if args.assignments:
        summary["assignments"] = str(args.assignments)
    if args.bound:
        from airflow_gpu.sim.bound import allocation_bound

        bound = allocation_bound(nodes, result.pods)
        summary["bound"] = {
            "gpu_allocation_pct": round(bound.pct, 4),
            "unallocated_gpus": round(bound.unallocated_gpus, 3),
            "gap_gpus": round((bound.gpu_milli - float(result.allocated[-1])) / 1000, 3),
            "method": bound.method,
            "seconds": round(bound.seconds, 3),
        }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{summary['trace']} policy={args.policy} seed={args.seed} ratio={args.ratio}"
            f"{' hold=' + format(summary['hold'], 'g') if summary['hold'] else ''}: "
            f"GPU allocation {summary['gpu_allocation_pct']:.2f}% "
            f"({summary['unallocated_gpus']:.1f} of {summary['total_gpus']} GPUs unallocated), "
            f"{summary['failed_pods']} of {summary['pods']} pods failed, {summary['seconds']:.1f}s"
        )
        if summary["experiment"]:
            print(f"  experiment: {summary['experiment']}; {summary['displaced_pods']} held pods displaced "
                  f"by larger ones")
        print("  at arrived " + ", ".join(f"{k}%: {v:.2f}%" for k, v in summary["allocation_at_pct"].items()))
        if args.bound:
            b = summary["bound"]
            print(f"  upper bound {b['gpu_allocation_pct']:.2f}% ({b['method']}): gap {b['gap_gpus']:.1f} GPUs")
    return 0


ASSIGNMENT_COLUMNS = ("pod", "node", "gpu_shares", "cpu_milli", "memory_mib")


def write_assignments(path: Path, placements) -> None:
    """One row per placed pod; gpu_shares is 'index:milli' joined by ';' (empty for CPU-only pods)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(ASSIGNMENT_COLUMNS)
        for p in placements:
            shares = ";".join(f"{g}:{m}" for g, m in p.gpu_shares)
            writer.writerow((p.pod, p.node, shares, p.cpu_milli, p.memory_mib))
