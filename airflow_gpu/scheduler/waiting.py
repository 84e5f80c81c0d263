"""Waiting gangs as the user and the back-off see them: the PodGroup status to write (with the
TimedOut phase past spec.scheduleTimeoutSeconds), the timeout reports, and when room may have
appeared since the last cycle (what resets core.backoff.Backoff). Pure functions of the World."""

from __future__ import annotations

from airflow_gpu import constants as C
from airflow_gpu.core.reservation import Reservation
from airflow_gpu.kube.convert import ConversionError, parse_time, schedule_timeout
from airflow_gpu.scheduler.state import Unit, World


def desired_podgroup_status(unit: Unit, has_plan: bool, assumed: dict[str, str], timed_out: bool = False) -> dict:
    """PodGroup .status fields as the coscheduling controller keeps them (only fields its CRD schema
    has: a real API server prunes others): phase and member counts. A pending group past its
    scheduleTimeoutSeconds shows phase TimedOut (the schema has no conditions to say it with)."""
    phases = [(p.get("status") or {}).get("phase") for p in unit.pods]
    running, succeeded, failed = phases.count("Running"), phases.count("Succeeded"), phases.count("Failed")
    bound = len(unit.bound(assumed))
    need = unit.min_member
    if has_plan:
        phase = "Scheduling"
    elif succeeded >= need:
        phase = "Finished"
    elif failed and running + succeeded < need and bound < need:
        phase = "Failed"
    elif running >= need:
        phase = "Running"
    elif bound + succeeded >= need:
        phase = "Scheduled"
    else:
        phase = C.PODGROUP_PHASE_TIMED_OUT if timed_out else "Pending"
    return {"phase": phase, "running": running, "succeeded": succeeded, "failed": failed}


def wanted_status(world: World, unit: Unit, has_plan: bool, timed_out: bool, assumed: dict[str, str]) -> dict | None:
    """desired_podgroup_status, kept with the unit's objects between cycles (state.Derived); None: its
    minMember is invalid."""
    d = world.derived.get(unit.key)
    key = (has_plan, timed_out)
    if d is not None and d.status is not None and d.status[0] == key:
        return d.status[1]
    try:
        want = desired_podgroup_status(unit, has_plan, assumed, timed_out)
    except ValueError:
        want = None
    if d is not None:
        d.status = (key, want)
    return want


def timeouts(world: World, waiting: dict[str, str], now: float) -> tuple[dict[str, str], list[tuple[Unit, str]]]:
    """PodGroups still waiting past spec.scheduleTimeoutSeconds -> the report (with the last wait
    reason: this cycle's, else the one already written), and the groups whose timeout is invalid."""
    out: dict[str, str] = {}
    bad: list[tuple[Unit, str]] = []
    reasons = {u.key: r for u, r in world.incomplete}
    for unit in [u for u, _ in world.pending] + [u for u, _ in world.incomplete]:
        pg = unit.podgroup
        if pg is None:
            continue
        try:
            limit = schedule_timeout(pg)
        except ConversionError as exc:
            bad.append((unit, str(exc)))
            continue
        if limit is None:
            continue
        try:
            start = parse_time((pg.get("status") or {}).get("scheduleStartTime")) or \
                parse_time((pg.get("metadata") or {}).get("creationTimestamp"))
        except ConversionError as exc:
            bad.append((unit, f"PodGroup {unit.key}: status.scheduleStartTime: {exc}; its timeout is not applied"))
            continue
        if start is None or now - start < limit:
            continue
        last = waiting.get(unit.key) or reasons.get(unit.key) or unit.annotation(C.ANNOTATION_WAIT_REASON) \
            or "not yet tried"
        out[unit.key] = (f"not scheduled within spec.scheduleTimeoutSeconds={limit} (waiting {now - start:.0f} s); "
                         f"last wait reason: {last}. Its pods stay pending and it is still tried.")
    return out, bad


class RoomWatch:
    """Has room possibly appeared since the last cycle? Yes when a pod stopped holding resources, a
    held plan was dropped, a node joined or changed, or the head-of-line reservation moved or ended.
    Over-reporting only costs a retry; missing a change costs at most the back-off cap."""

    def __init__(self) -> None:
        self._seen: tuple[dict, set, dict] | None = None  # running gangs by id, plans, nodes: last cycle
        self._head: str | None = None  # the gang holding last cycle's reservation

    def changed(self, world: World) -> bool:
        running = {id(rg): rg for rg in world.running}  # the build keeps an unchanged gang's very object
        plans = set(world.plans)
        nodes = dict(world.nodes)
        last, self._seen = self._seen, (running, plans, nodes)
        if last is None:
            return False
        # a pod held last cycle and not now: only the pods of gangs whose object changed are compared
        gone = {p.pod for key, rg in last[0].items() if key not in running for p in rg.placements}
        if gone:
            gone -= {p.pod for key, rg in running.items() if key not in last[0] for p in rg.placements}
        return bool(gone or last[1] - plans
                    or any((old := last[2].get(n)) is not node and old != node for n, node in nodes.items()))

    def head_moved(self, reservation: Reservation | None) -> bool:
        head = reservation.gang.name if reservation is not None else None
        moved = self._head is not None and head != self._head
        self._head = head
        return moved
