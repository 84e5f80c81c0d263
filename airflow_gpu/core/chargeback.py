"""Chargeback: GPU-hours per team, product and capacity type, priced from the config's price table,
with the GPU-hours lost to interruptions, preemptions and the restarts they cause charged under one
loss policy.

Pure: the ledger's records come from the UI layer (pods on the cluster, the operator's XCom results);
this module only decides what a record costs and who pays for lost work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

CAUSE_INTERRUPTION = "interruption"
CAUSE_PREEMPTION = "preemption"
CAUSE_RESTART = "restart"  # a relaunched attempt's restart overhead (core.model.restart_lost_gpu_seconds)
CAPACITY_UNKNOWN = "unknown"  # pod record gone, only the XCom result is left: priced on-demand

# who pays for GPU-hours lost since the last checkpoint
POLICY_PLATFORM = "platform"  # the platform absorbs them: the team is not charged
POLICY_SPOT = "spot"  # the team pays them at the spot rate
POLICY_ON_DEMAND = "on-demand"  # the team pays them at the on-demand rate
LOSS_POLICIES = (POLICY_PLATFORM, POLICY_SPOT, POLICY_ON_DEMAND)


@dataclass(frozen=True)
class Usage:
    """GPU time of one pod (or one task try whose pods are gone): `gpus` from `start` to `end`
    (epoch seconds); `lost_gpu_seconds` of it were thrown away by `cause`."""

    team: str
    product: str
    capacity_type: str  # spot | on-demand | unknown
    gpus: float
    start: float
    end: float
    lost_gpu_seconds: float = 0.0
    cause: str | None = None  # interruption | preemption | restart | None
    ref: str = ""  # pod key or dag/task/run/try, for the CSV

    @property
    def gpu_seconds(self) -> float:
        return self.gpus * max(0.0, self.end - self.start)


@dataclass
class ChargeRow:
    team: str
    product: str
    capacity_type: str
    gpu_hours: float = 0.0
    # gpu_hours x the product's relative_speed: the work done, in GPU-hours of the reference product
    # (a job accepting H100 and A100 shows here what its H100 hours were worth in A100 hours)
    reference_gpu_hours: float = 0.0
    lost_interruption_hours: float = 0.0
    lost_preemption_hours: float = 0.0
    lost_restart_hours: float = 0.0  # restart overhead of relaunched attempts: held, computing nothing
    cost: float = 0.0
    # the quota file has no price for the product (an unknown product recorded by an older run, another
    # backend): its hours are counted, its cost is None rather than failing the whole report
    priced: bool = True
    refs: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"team": self.team, "product": self.product, "capacity_type": self.capacity_type,
                "gpu_hours": round(self.gpu_hours, 6), "reference_gpu_hours": round(self.reference_gpu_hours, 6),
                "lost_interruption_hours": round(self.lost_interruption_hours, 6),
                "lost_preemption_hours": round(self.lost_preemption_hours, 6),
                "lost_restart_hours": round(self.lost_restart_hours, 6),
                "cost": round(self.cost, 6) if self.priced else None}


def check_policy(policy: str) -> str:
    if policy not in LOSS_POLICIES:
        raise ValueError(f"loss policy must be one of {', '.join(LOSS_POLICIES)} (got {policy!r})")
    return policy


def rate(prices: Mapping[str, tuple[float, float]], product: str, capacity_type: str) -> float:
    """Price of one GPU-hour; `prices` maps product -> (on_demand, spot). Unknown capacity = on-demand."""
    if product not in prices:
        raise KeyError(f"no price for GPU product {product!r} (products: {', '.join(sorted(prices))})")
    on_demand, spot = prices[product]
    return spot if capacity_type == "spot" else on_demand


def clipped(u: Usage, since: float, until: float) -> tuple[float, float]:
    """(GPU-seconds, lost GPU-seconds) of `u` inside [since, until). Lost work is booked when it is
    lost (at the record's end)."""
    lo, hi = max(u.start, since), min(u.end, until)
    used = u.gpus * max(0.0, hi - lo)
    lost = min(u.lost_gpu_seconds, used) if since <= u.end < until else 0.0
    return used, lost


def charge(records: Iterable[Usage], prices: Mapping[str, tuple[float, float]], since: float, until: float,
           policy: str = POLICY_PLATFORM, speeds: Mapping[str, float] | None = None) -> list[ChargeRow]:
    """Rows per (team, product, capacity type), sorted. Lost hours are part of gpu_hours (the GPUs were
    held); `policy` decides their price: 0, the spot rate or the on-demand rate. `speeds`: product ->
    relative speed (absent: 1.0), for reference_gpu_hours."""
    check_policy(policy)
    rows: dict[tuple[str, str, str], ChargeRow] = {}
    for u in records:
        used, lost = clipped(u, since, until)
        if used <= 0 and lost <= 0:
            continue
        row = rows.setdefault((u.team, u.product, u.capacity_type), ChargeRow(u.team, u.product, u.capacity_type))
        if u.product in prices:
            base = rate(prices, u.product, u.capacity_type)
            lost_rate = {POLICY_PLATFORM: 0.0, POLICY_SPOT: prices[u.product][1],
                         POLICY_ON_DEMAND: prices[u.product][0]}[policy]
        else:
            row.priced, base, lost_rate = False, 0.0, 0.0
        row.gpu_hours += used / 3600
        row.reference_gpu_hours += used / 3600 * (speeds or {}).get(u.product, 1.0)
        if u.cause == CAUSE_PREEMPTION:
            row.lost_preemption_hours += lost / 3600
        elif u.cause == CAUSE_RESTART:
            row.lost_restart_hours += lost / 3600
        elif lost:
            row.lost_interruption_hours += lost / 3600
        row.cost += (used - lost) / 3600 * base + lost / 3600 * lost_rate
        row.refs.append(u.ref)
    return [rows[k] for k in sorted(rows)]
