"""How a gang's ends read in the task log: each rank's end (pod, node, exit code, reason), the tail of
its log with a line saying what was cut, the failure message, and the result rank 0 hands back.

Pure: pod dicts and log text in, text out. The worker reads the pods and logs (operators/gang_logs.py).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass
from typing import Any

from airflow_gpu import constants as C
from airflow_gpu.kube.state import member_state
from airflow_gpu.kube.wire import as_dict

DEFAULT_TAIL_LINES = 200
# bytes of one rank's tail in the task log: a tail of long lines (a progress bar without newlines) stays bounded
TAIL_MAX_BYTES = 256 * 1024
MESSAGE_TAIL_LINES = 5  # lines of each failed rank's tail quoted in the task's exception
# The training code's result: rank 0's container has its terminationMessagePath at C.RESULT_PATH, so the
# kubelet keeps the file in the pod's status when the container ends (no sidecar, no exec)
RESULT_PATH, RESULT_MAX_BYTES = C.RESULT_PATH, C.RESULT_MAX_BYTES


STOPPED_EXIT_CODES = (None, 0, C.EXIT_CODE_STOPPED, 137)  # SIGTERM saved-and-stopped, SIGKILL at the grace's end


class ResultError(ValueError):
    """rank 0's return.json cannot become the task's result."""


@dataclass(frozen=True)
class RankEnd:
    """How one rank's pod ended (or where it is, if it has not)."""

    pod: str
    rank: int | None
    node: str | None
    phase: str
    exit_code: int | None
    reason: str  # OOMKilled, Error, Completed, Evicted, a DisruptionTarget reason, or the phase
    message: str = ""  # the container's termination message (rank 0: its result)

    @property
    def failed(self) -> bool:
        return self.phase == "Failed" or (self.exit_code is not None and self.exit_code != 0)

    def describe(self) -> str:
        code = "no exit code" if self.exit_code is None else f"exit code {self.exit_code}"
        return (f"rank {'?' if self.rank is None else self.rank}: pod {self.pod} on node {self.node or '-'}, "
                f"{code} ({self.reason})")


def rank_end(pod: Any, container: str | None = None) -> RankEnd:
    pod = as_dict(pod)
    m = member_state(pod, container=container)
    status = pod.get("status") or {}
    term, message = {}, ""
    for cs in status.get("containerStatuses") or []:
        if container and cs.get("name") != container:
            continue
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
        message = term.get("message") or ""
        break
    reason = m.disruption or status.get("reason") or term.get("reason") or m.phase
    return RankEnd(m.name, m.rank, m.node, m.phase, m.exit_code, reason, message)


def ranks_to_show(ends: list[RankEnd], disrupted: bool = False) -> list[RankEnd]:
    """Every rank that failed, and rank 0, in rank order. In a disrupted gang every rank was stopped
    (exit 143 after SIGTERM): rank 0 and the ranks that failed otherwise."""
    def shown_failed(e: RankEnd) -> bool:
        return e.failed and not (disrupted and e.exit_code in STOPPED_EXIT_CODES)
    shown = [e for e in ends if e.rank == 0 or shown_failed(e)]
    return sorted(shown, key=lambda e: (e.rank if e.rank is not None else 1 << 30, e.pod))


def trim_tail(text: str, lines: int, more_before: bool, max_bytes: int = TAIL_MAX_BYTES) -> tuple[str, str | None]:
    """(the last `lines` lines of `text`, at most `max_bytes` of them; a line saying what was cut, or None).
    more_before: the log had lines before `text` (it was read with tailLines)."""
    kept = text.splitlines(keepends=True)
    dropped = max(0, len(kept) - lines)
    kept = kept[dropped:]
    body = "".join(kept)
    raw = body.encode("utf-8", "replace")
    cut_bytes = max(0, len(raw) - max_bytes)
    if cut_bytes:
        body = raw[cut_bytes:].decode("utf-8", "replace")
    if not (more_before or dropped or cut_bytes):
        return body, None
    parts = []
    if more_before or dropped:
        parts.append(f"only the last {len(kept)} lines are shown (log_tail_lines={lines})")
    if cut_bytes:
        parts.append(f"{cut_bytes} bytes at the start of them cut (at most {max_bytes} bytes a rank)")
    return body, f"[... earlier output cut: {'; '.join(parts)} ...]"


def rank_block(end: RankEnd, namespace: str, attempt: int, tail: str | None, cut: str | None) -> str:
    """One rank's end for the task log: a header, the cut line, the tail, an end line."""
    head = f"===== {end.describe()}, attempt {attempt} ====="
    if tail is None:
        body = "(no log: the pod or its log is gone)\n"
    else:
        body = (cut + "\n" if cut else "") + (tail if tail.endswith("\n") or not tail else tail + "\n")
    return (f"{head}\n{body}===== end of rank {end.rank} (all of it while the pod exists: "
            f"kubectl logs -n {namespace} {end.pod}) =====")


def last_lines(text: str | None, n: int = MESSAGE_TAIL_LINES) -> list[str]:
    return [line for line in (text or "").splitlines() if line.strip()][-n:]


def failure_message(gang: str, failed: list[RankEnd], tails: dict[str, str | None], reason: str) -> str:
    """The exception of an application failure: which ranks failed, how, and how their logs end."""
    if not failed:
        return f"gang {gang} failed: {reason}"
    parts = []
    for end in failed:
        lines = last_lines(tails.get(end.pod))
        quoted = (": its log ends with:\n    " + "\n    ".join(lines)) if lines else " (no log)"
        parts.append(f"{end.describe()}{quoted}")
    return (f"gang {gang} failed (application failure) - " + "; ".join(parts) +
            "\nThe task log has each failed rank's last lines; Airflow retries the task if retries remain.")


def parse_result(message: str) -> Any:
    """The value of rank 0's return.json (its termination message), or ResultError saying what is wrong."""
    size = len(message.encode("utf-8"))
    try:
        return json.loads(message)
    except ValueError as exc:
        if size >= RESULT_MAX_BYTES:
            raise ResultError(f"{RESULT_PATH} from rank 0 is too big: the kubelet keeps {RESULT_MAX_BYTES} bytes of "
                              "it and the rest is cut; return a small value (a metric, a URI) and keep large "
                              "outputs in the checkpoint store") from None
        raise ResultError(f"{RESULT_PATH} from rank 0 is not valid JSON ({exc}); it starts with "
                          f"{message[:80]!r}; write it with airflow_gpu.checkpoint.write_result(value)") from None


# --- live logs: timestamped lines (kubectl logs --timestamps) ---------------------------------

def split_timestamp(line: str) -> tuple[str | None, str]:
    """("2026-01-01T00:00:00.123456789Z", message) of a --timestamps line; (None, line) if it has none."""
    stamp, sep, message = line.partition(" ")
    if sep and stamp[:4].isdigit() and stamp.endswith("Z") and "T" in stamp:
        return stamp, message
    return None, line


def stamp_key(stamp: str) -> tuple[str, int]:
    """An ordering key for RFC 3339 UTC timestamps of any fraction (nanoseconds compare exactly)."""
    whole, _, frac = stamp.rstrip("Z").partition(".")
    return whole, int((frac + "000000000")[:9])


STREAMED_ALL = "[rank 0's output is above: live logs streamed all of it]"
STREAMED_SOME = "[... rank 0's earlier output is above (live logs); what came after it follows ...]"


def unstreamed(stamped: str, streamed_until: str) -> tuple[str, str | None]:
    """A tail read with timestamps, without the lines live logs already wrote (at or before
    `streamed_until`, the last one they wrote): (the rest, stamps removed; a line saying the rest is
    above, or None when nothing had been streamed)."""
    kept, dropped = [], 0
    for line in stamped.splitlines(keepends=True):
        stamp, message = split_timestamp(line)
        if stamp is not None and stamp_key(stamp) <= stamp_key(streamed_until):
            dropped += 1
            continue
        kept.append(message)
    if not dropped:
        return "".join(kept), None
    return "".join(kept), STREAMED_SOME if kept else STREAMED_ALL


def since_seconds(stamp: str, now: float) -> int:
    """sinceSeconds for a read resumed after `stamp` (the clients have no sinceTime; KPO does the same):
    whole seconds back to it, one more for clock skew; lines at or before `stamp` are skipped by the reader."""
    whole = dt.datetime.strptime(stamp.rstrip("Z").partition(".")[0], "%Y-%m-%dT%H:%M:%S")
    return max(1, math.ceil(now - whole.replace(tzinfo=dt.timezone.utc).timestamp()) + 1)


__all__ = ["DEFAULT_TAIL_LINES", "RESULT_PATH", "RESULT_MAX_BYTES", "RankEnd", "ResultError", "failure_message",
           "parse_result", "rank_block", "rank_end", "ranks_to_show", "trim_tail", "unstreamed"]
