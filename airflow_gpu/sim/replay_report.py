"""What a replay measured: the summary numbers, the events CSV, plots and a short markdown report."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from airflow_gpu.constants import CAPACITY_SPOT, TIERS
from airflow_gpu.core.model import GPU_MILLI
from airflow_gpu.sim.replay import FINISHED, ReplayResult
from airflow_gpu.sim.start_accuracy import error_table, write_estimates

STARVED_AFTER = 24 * 3600.0
EVENT_COLUMNS = ("job", "attempt", "team", "tier", "gpu_milli", "submit", "start", "end", "outcome", "kept_seconds",
                 "pods")


def _clip(a: float, b: float, h: float) -> float:
    return max(0.0, min(b, h) - max(a, 0.0))


def job_waits(r: ReplayResult) -> dict[str, list[float]]:
    """Per tier: first start - submit; a job that never ran waits until the end of the replay."""
    out: dict[str, list[float]] = {}
    for st in r.jobs.values():
        start = st.first_start if st.first_start is not None else r.end
        out.setdefault(st.job.tier, []).append(start - st.job.submit)
    return out


def contended(r: ReplayResult) -> tuple[float, float, float]:
    """(seconds of the horizon during which GPU work waited, allocated and computing GPU fraction x
    seconds over them): how busy the platform keeps its GPUs while it has a queue."""
    t_in = alloc = busy = 0.0
    curve = r.util_curve
    for (t, held, computing, waiting), nxt in zip(curve, curve[1:] + [(r.horizon, 0.0, 0.0, False)]):
        dt = _clip(t, nxt[0], r.horizon)
        if waiting and dt > 0:
            t_in += dt
            alloc += held * dt
            busy += computing * dt
    return t_in, alloc, busy


def summarize(r: ReplayResult) -> dict:
    h = r.horizon
    capacity = sum(n.gpu_count for n in r.nodes) * GPU_MILLI * h
    allocated = useful = lost = restart = 0.0
    for a in r.attempts:
        asked = a.job.worker.gpu_milli_total  # useful is the work's own ask: a share run on a whole GPU uses the share
        restart += a.restart_lost
        if a.start is not None:
            paid = min(a.overhead, a.end - a.start)  # restart overhead: held, computing nothing
            lost += a.restart_lost
        for _, since, p in a.holds:
            milli = sum(m for _, m in p.gpu_shares)
            allocated += milli * _clip(since, a.end, h)
            if a.start is not None:
                useful += asked * _clip(a.start + paid, a.start + paid + a.kept, h)
                if a.outcome != FINISHED:
                    lost += asked * (a.end - a.start - paid - a.kept) / GPU_MILLI
    contended_time, contended_alloc, contended_busy = contended(r)
    waits = job_waits(r)
    queue = {}
    for tier in list(TIERS) + sorted(set(waits) - set(TIERS)):  # a quota file's own tiers too
        w = np.array(waits.get(tier, []), dtype=float)
        if len(w):
            queue[tier] = {"mean": round(float(w.mean()), 1), "p50": round(float(np.percentile(w, 50)), 1),
                           "p95": round(float(np.percentile(w, 95)), 1), "p99": round(float(np.percentile(w, 99)), 1),
                           "jobs": int(len(w))}
    starved = sum(1 for st in r.jobs.values() if st.first_start is None
                  or st.first_start - st.job.submit > STARVED_AFTER)
    hours = h / 3600
    cost = 0.0
    for n in r.nodes:
        on_demand, spot = r.setting.prices.get(n.gpu_product or "", (0.0, 0.0))
        cost += n.gpu_count * hours * (spot if n.capacity_type == CAPACITY_SPOT else on_demand)
    return {
        "gpu_utilization_pct": round(100 * allocated / capacity, 2) if capacity else 0.0,
        "contended_time_pct": round(100 * contended_time / h, 2) if h else 0.0,
        "gpu_utilization_when_contended_pct": round(100 * contended_alloc / contended_time, 2) if contended_time else None,
        "computing_when_contended_pct": round(100 * contended_busy / contended_time, 2) if contended_time else None,
        "useful_gpu_utilization_pct": round(100 * useful / capacity, 2) if capacity else 0.0,
        "queue_wait_seconds": queue,
        "lost_gpu_seconds": round(lost, 1),  # work thrown away and restart overhead
        "restart_lost_gpu_seconds": round(restart, 1),
        "cost": round(cost, 2),
        "starved_jobs": starved,
        "preemptions": r.preemptions,
        "interruptions": r.interruptions,
        "preemptions_per_job": round(r.preemptions / len(r.jobs), 4) if r.jobs else 0.0,
        "finished_jobs": sum(1 for st in r.jobs.values() if st.finished_at is not None),
        "guarantee_met_pct": {t: round(100 * m / w, 1) if w else 100.0 for t, (m, w) in r.guarantee.items()},
        "seconds": round(r.seconds, 2),
        # utilisation and cost are over [0, horizon] (replay.measured_horizon, every platform's); the
        # platform's last event (its drain) may be later
        "horizon_seconds": round(h, 1),
        "end_seconds": round(r.end, 1),
        # per tier, how right the published estimated start was (sim/start_accuracy.py); None: none published
        "estimated_start_error": None if r.start_samples is None else error_table(r.start_samples),
        # held placements (core/holding.py): their cost; None: the platform held none
        "held_placements": None if r.holds is None else {
            "pods": r.holds.held, "displaced": r.holds.displaced,
            "idle_gpu_seconds": round(r.holds.idle_gpu_seconds, 1),
            "added_wait_seconds": round(r.holds.added_wait_seconds, 1),
            "added_wait_per_held_pod_seconds": round(r.holds.added_wait_seconds / r.holds.held, 1) if r.holds.held else 0.0,
        },
    }


def write_events(r: ReplayResult, directory: Path) -> Path:
    """One row per job attempt; `pods` = node:gpu_index=milli[+...]@since per pod, ';'-separated.
    Beside it, <platform>.quota.json: each team's guarantee and borrowing limit (milli-GPU per product),
    and <platform>.estimates.csv: every estimated start sampled and the real start (sim/start_accuracy.py)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{r.platform.name}.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(EVENT_COLUMNS)
        for a in r.attempts:
            pods = ";".join(f"{p.node}:" + "+".join(f"{i}={m}" for i, m in p.gpu_shares) + f"@{since:.3f}"
                            for _, since, p in a.holds)
            w.writerow((a.job.name, a.attempt, a.job.team, a.job.tier, sum(m for _, _, p in a.holds
                                                                               for _, m in p.gpu_shares),
                        f"{a.job.submit:.3f}", "" if a.start is None else f"{a.start:.3f}", f"{a.end:.3f}",
                        a.outcome, f"{a.kept:.3f}", pods))
    quota = {}
    if r.quota is not None:
        for team, tq in r.quota.teams.items():
            quota[team] = {"nominal": {k[0]: v for k, v in tq.nominal.items()},
                           "borrowing_limit": {k[0]: v for k, v in tq.borrowing_limit.items()}}
    nodes = {n.name: {"gpus": n.gpu_count, "product": n.gpu_product} for n in r.nodes}
    (directory / f"{r.platform.name}.quota.json").write_text(json.dumps({"teams": quota, "nodes": nodes}, indent=1))
    if r.start_samples is not None:
        write_estimates(r.start_samples, directory / f"{r.platform.name}.estimates.csv")
    return path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(results: list[ReplayResult], summaries: dict[str, dict], directory: Path) -> list[Path]:
    """utilization.png and wait_cdf.png (naive and full), ablations.png (every platform)."""
    plt = _pyplot()
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    fig, ax = plt.subplots(figsize=(9, 4))
    for r in results:
        if r.platform.name in ("naive", "full"):
            t = np.array([x for x, *_ in r.util_curve]) / 86400
            held = np.array([y for _, y, *_ in r.util_curve]) * 100
            computing = np.array([c for _, _, c, _ in r.util_curve]) * 100
            line, = ax.step(t, computing, where="post", label=f"{r.platform.name}: computing", lw=0.8)
            if np.any(held > computing + 1e-9):  # naive holds whole GPUs for shares and partial gangs
                ax.step(t, held, where="post", label=f"{r.platform.name}: allocated", lw=0.6, ls=":",
                        color=line.get_color())
    ax.set(xlabel="day", ylabel="% of the GPUs", title="GPU utilisation over time", ylim=(0, 105))
    ax.legend(fontsize="small", loc="upper left")
    out.append(directory / "utilization.png")
    fig.savefig(out[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        if r.platform.name not in ("naive", "full"):
            continue
        for tier, w in sorted(job_waits(r).items()):
            w = np.sort(np.maximum(np.array(w), 1.0))
            ax.step(w, np.arange(1, len(w) + 1) / len(w), where="post", label=f"{r.platform.name} {tier}")
    ax.set(xscale="log", xlabel="queue wait (s)", ylabel="fraction of jobs", title="Queue wait CDF per tier")
    ax.legend(fontsize=7)
    out.append(directory / "wait_cdf.png")
    fig.savefig(out[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    out.append(plot_ablations(summaries, directory / "ablations.png"))
    return out


def plot_ablations(summaries: dict[str, dict], path: Path) -> Path:
    """Utilisation (allocated and useful over the horizon, computing while GPU work waits) and
    production p95 wait per platform, from the summaries alone (the --json output's platforms)."""
    plt = _pyplot()
    names = list(summaries)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    x = np.arange(len(names))
    series = (("gpu_utilization_pct", "allocated, over the horizon"),
              ("useful_gpu_utilization_pct", "useful, over the horizon"),
              ("computing_when_contended_pct", "computing while GPU work waits"))
    for k, (key, label) in enumerate(series):
        axes[0].bar(x + (k - 1) * 0.27, [summaries[n][key] or 0 for n in names], 0.27, label=label)
    axes[0].set(ylabel="%", title="GPU utilisation", ylim=(0, 140), yticks=range(0, 101, 20))
    axes[0].legend(fontsize="small", loc="upper left")
    axes[1].bar(x, [summaries[n]["queue_wait_seconds"].get("production-training", {}).get("p95", 0) / 3600
                    for n in names])
    axes[1].set(ylabel="hours", title="production-training p95 queue wait")
    for ax in axes:
        ax.set_xticks(x, names, rotation=60, ha="right")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def markdown(doc: dict) -> str:
    lines = [f"# Replay of {doc['trace']} (capacity {doc['capacity']}, seed {doc['seed']})", ""]
    if doc.get("parameters"):
        lines += ["Parameters: " + ", ".join(f"{k}={v}" for k, v in doc["parameters"].items()), ""]
    if doc.get("mapping"):
        m = doc["mapping"]
        lines += ["Trace teams -> quota file teams: " + ", ".join(f"{k or '(none)'} -> {v}" for k, v in m["teams"].items()),
                  "Trace tiers -> tiers: " + ", ".join(f"{k or '(none)'} -> {v}" for k, v in m["tiers"].items()),
                  "Guaranteed shares: " + ", ".join(f"{k} {100 * v:.1f} %" for k, v in m["shares"].items()), ""]
    first = next(iter(doc["platforms"].values()), None)
    if first and "horizon_seconds" in first:
        ends = ", ".join(f"{name} {s['end_seconds']:,.0f} s" for name, s in doc["platforms"].items())
        lines += [f"Utilisation and cost over the first {first['horizon_seconds']:,.0f} s (the arrivals, or the trace's "
                  f"GPU work packed on every GPU if that is longer); the last job ended at: {ends}.", ""]
    lines += ["| platform | util % | useful % | computing while queued % | prod p95 wait (s) | best-effort p95 (s) "
              "| lost GPU-h | restart GPU-h | cost | starved | preemptions | per job | interruptions | s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in doc["platforms"].items():
        q = s["queue_wait_seconds"]
        lines.append(f"| {name} | {s['gpu_utilization_pct']} | {s['useful_gpu_utilization_pct']} | "
                     f"{s['computing_when_contended_pct'] if s['computing_when_contended_pct'] is not None else '-'} | "
                     f"{q.get('production-training', {}).get('p95', '-')} | "
                     f"{q.get('best-effort-training', {}).get('p95', '-')} | {s['lost_gpu_seconds'] / 3600:.1f} | "
                     f"{s.get('restart_lost_gpu_seconds', 0) / 3600:.1f} | {s['cost']:.0f} | {s['starved_jobs']} | "
                     f"{s['preemptions']} | {s.get('preemptions_per_job', 0)} | {s['interruptions']} | "
                     f"{s['seconds']} |")
    naive, full = doc["platforms"].get("naive"), doc["platforms"].get("full")
    if naive and full:
        n95 = naive["queue_wait_seconds"].get("production-training", {}).get("p95")
        f95 = full["queue_wait_seconds"].get("production-training", {}).get("p95")
        if n95:
            # naive's allocation counts whole GPUs held by shares and partial gangs: useful work and
            # the GPUs computing while work waits are the comparable utilisation
            lines += ["", f"Production p95 queue wait: {n95:.0f} s -> {f95:.0f} s "
                          f"({100 * (f95 - n95) / n95:+.1f} %); useful utilisation {naive['useful_gpu_utilization_pct']} "
                          f"% -> {full['useful_gpu_utilization_pct']} %, computing while GPU work waits "
                          f"{naive['computing_when_contended_pct']} % -> {full['computing_when_contended_pct']} % "
                          f"(allocated {naive['gpu_utilization_pct']} % -> {full['gpu_utilization_pct']} %)."]
    lines += _hold_lines(doc["platforms"])
    lines += _estimate_lines(doc["platforms"])
    return "\n".join(lines) + "\n"


def _hold_lines(platforms: dict[str, dict]) -> list[str]:
    """Held placements: their cost (GPUs reserved idle, start delayed) beside their gain (`no-hold`)."""
    out = []
    base = platforms.get("no-hold")
    for name, s in platforms.items():
        h = s.get("held_placements")
        if not h:
            continue
        gain = (f"; utilisation {base['gpu_utilization_pct']} % without (no-hold) -> {s['gpu_utilization_pct']} %, "
                f"useful {base['useful_gpu_utilization_pct']} % -> {s['useful_gpu_utilization_pct']} %") if base else ""
        out.append(f"Held placements ({name}): {h['pods']} pods held, {h['displaced']} displaced; cost "
                   f"{h['idle_gpu_seconds'] / 3600:.2f} GPU-h reserved idle, {h['added_wait_seconds']:.0f} s of added "
                   f"queue wait ({h['added_wait_per_held_pod_seconds']:.0f} s per held pod){gain}.")
    return [""] + out if out else []


def _estimate_lines(platforms: dict[str, dict]) -> list[str]:
    """The predicted-start accuracy table: per platform that publishes estimates and tier."""
    rows = [(name, tier, e) for name, s in platforms.items() for tier, e in (s.get("estimated_start_error") or {}).items()]
    if not rows:
        return []
    dash = lambda v: "-" if v is None else v  # noqa: E731
    out = ["", "Estimated start (as published) against the real start, sampled at submission and hourly:", "",
           "| platform | tier | median error (s) | p90 error (s) | within 15 min % | within 25 % of the wait % "
           "| unknown % | samples |", "|---|---|---|---|---|---|---|---|"]
    for name, tier, e in rows:
        out.append(f"| {name} | {tier} | {dash(e['median_s'])} | {dash(e['p90_s'])} | {dash(e['within_15min_pct'])} "
                   f"| {dash(e['within_25pct_pct'])} | {dash(e['unknown_pct'])} | {e['samples']} |")
    return out
