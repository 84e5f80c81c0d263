"""Re-checking a held plan against the cluster as it is now, before anything is done for it.

A plan (a gang's placements, and for a preemption its victims) is written before the first Binding
or Eviction and read back after a restart. Even from a store only the scheduler writes, it describes
a past cluster: a node may have been relabelled or tainted, a victim may have been replaced or raised
in priority, a quota may have shrunk. So before a plan holds GPUs, binds a member or evicts a victim,
the rules are applied again here: every placement passes the static filters on its node (node
selector, taints and tolerations, capacity type, GPU product), every victim that is still running
is one the gang may preempt now (core.preemption.candidates: lower priority, preemptible tier,
reclaimable borrower), and the gang's quota admits what it has yet to bind. Room on the node is not
required: a nomination waits for its victims to free it, and the caller holds what is free. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.model import GPU_MILLI, Gang, Placement, PodRequest, RunningGang
from airflow_gpu.core.plugins.filters import CapacityType, GpuProduct, NodeSelector, TaintToleration
from airflow_gpu.core.preemption import PreemptionPolicy, candidates
from airflow_gpu.core.snapshot import OverCommitError, Snapshot

STATIC_FILTERS = (NodeSelector(), TaintToleration(), CapacityType(), GpuProduct())


def _reason_at(reason, i: int) -> str:
    if isinstance(reason, str):
        return reason
    labels = reason() if callable(reason) else reason
    return str(np.asarray(labels)[i])


def recheck_plan(state: CycleState, gang: Gang, placements: Sequence[Placement],
                 victims: Sequence[RunningGang] = (), *, now: float,
                 policy: PreemptionPolicy = PreemptionPolicy(),
                 leaving: Sequence[RunningGang] = ()) -> str | None:
    """None if the plan may still be acted on, else why not (for the gang's Event).

    `gang`: its pending members as converted now (decided tier, spot eligibility, tolerations);
    `placements`: the plan's placements of those members; `victims`: the running gangs the plan
    still has to stop; `leaving`: its victims already terminating (gone either way: not checked
    as candidates, but the plan is judged once they are gone). `state` holds everything but this
    plan, terminating gangs included."""
    members = {m.name: m for m in gang.members}
    snap = state.snap
    for p in placements:
        req = members.get(p.pod)
        if req is None:
            return f"the plan places {p.pod}, which is not a pending member of gang {gang.name}"
        try:
            i = snap.node_index(p.node)
        except KeyError:
            return f"the plan places {p.pod} on node {p.node}, which is gone"
        for f in STATIC_FILTERS:
            result = f.filter(snap, req)
            if not result.ok[i]:
                return f"the plan places {p.pod} on node {p.node}: {_reason_at(result.reason, i)}"
    if victims:
        allowed = {rg.gang.name for rg in candidates(state, gang, now, policy)}
        for v in victims:
            if v.gang.name not in allowed:
                return (f"the plan would preempt gang {v.gang.name} (priority {v.gang.priority}), which gang "
                        f"{gang.name} (priority {gang.priority}) may not preempt now")
    gone = [*victims, *leaving]
    work = state.without(gone) if gone else state
    verdict = work.check(gang.team, work.demand(placements))
    if not verdict.fits:
        return f"the plan no longer fits its quota: {verdict.reason}"
    return None


def may_bind(state: CycleState, gang: Gang, placements: Sequence[Placement], victims_alive: bool) -> bool:
    """May a plan's members bind now (their nodes have room: checked by the caller)? Not while a
    victim still runs (a SIGTERM save can take minutes) unless quota allows both: the team would
    otherwise hold its preempted gangs and the preemptor at once, above its guarantee. `state`
    counts every gang still holding GPUs (terminating victims too) and not this plan."""
    return not victims_alive or state.check(gang.team, state.demand(placements)).fits


def hold_member(snap: Snapshot, node: str, req: PodRequest) -> bool:
    """Reserve a plan's member `req` on `node`; True if it fits whole. Which GPUs of the node does not
    matter on Kubernetes (the device plugin picks them), so the plan's GPU indices are not replayed:
    after a restart the running pods' indices are re-chosen and could collide with them. If it does
    not fit whole (victims still terminating), what is free of it is held under a hold name (whole
    free GPUs first, or one GPU's free share), so nobody else takes the GPUs as they are freed."""
    try:
        i = snap.node_index(node)
    except KeyError:
        return False  # node gone
    try:
        snap.assume(snap.placement_for(req, i))
        return True
    except OverCommitError:
        pass
    free = snap.gpu_free[i]
    if req.gpus:
        shares = tuple((int(g), GPU_MILLI) for g in np.flatnonzero(free == GPU_MILLI)[: req.gpus])
    elif req.gpu_milli:
        shares = tuple((int(g), int(min(free[g], req.gpu_milli))) for g in np.flatnonzero(free > 0)[:1])
    else:
        shares = ()
    partial = Placement(pod=f"{req.name}#held", node=node, gpu_shares=shares,
                        cpu_milli=min(req.cpu_milli, int(snap.cpu_free[i])),
                        memory_mib=min(req.memory_mib, int(snap.mem_free[i])))
    try:
        snap.assume(partial)
    except OverCommitError:
        pass
    return False


def nomination_lapsed(made_at: float, now: float, grace: float, slack: float) -> bool:
    """A nomination holds its GPUs while its victims stop: at most their longest grace period
    (`grace`, seconds) plus `slack` after it was made; past that it is dropped (or its bound part
    rolled back) and the gang queues again."""
    return now - made_at >= grace + slack
