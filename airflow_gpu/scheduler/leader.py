"""Leader election with a coordination.k8s.io/v1 Lease, so that of several replicas only one binds.

Why not `kubernetes.leaderelection`: it locks a ConfigMap annotation (not a Lease), builds its API
object from the global default configuration, takes whole seconds only, and keeps the leader's
callback running after a failed renewal. The rules here follow client-go:
- a candidate takes the Lease only when it is free, or when the holder's record has not changed for
  leaseDurationSeconds as measured on the candidate's own monotonic clock (never the remote clock);
- every write is an optimistic-concurrency update (resourceVersion), so two candidates cannot both win;
- the leader considers itself leader only until `renew_deadline` (< lease duration) after the start of
  its last successful renewal. It stops binding before anyone else may take over: `is_leader()` is
  the fence the scheduling loop checks before every write.

Under load (issue 31: a busy scheduler at load 4.5 refused 814 of its own bindings as "not leader",
and nothing said why) the renewal must not depend on the rest of the process:
- it runs on its own thread with its own ApiClient (its own connection pool: binds and watches never
  hold the connection it needs), every `retry_period` measured start to start on the monotonic clock;
- while leading, one request renews: the Lease as last written is replaced (optimistic concurrency;
  a 409 falls back to read-then-write), as client-go's fast path does, halving the API round trips;
- a request may take up to `renew_deadline` (a fixed 5 s timeout abandoned renewals that were merely
  slow, and with short deadlines waited past the fence);
- the fence is checked wherever the scheduler asks (`is_leader()`); the moment it is found expired it
  is logged once as "lost leadership" with the cause: how long since the last successful renewal, a
  renewal in flight for how long (API latency), the last error, how late the renewal thread woke
  (CPU starvation), or another holder;
- `wait_renewed()` lets a Binding wait briefly for a renewal in flight rather than be refused.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from datetime import datetime, timezone

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)


def _own_client(api_client: client.ApiClient) -> client.ApiClient:
    """An ApiClient of the same configuration with its own small connection pool."""
    cfg = copy.deepcopy(api_client.configuration)
    cfg.connection_pool_maxsize = 2
    own = client.ApiClient(cfg)
    own.user_agent = api_client.user_agent
    return own


def _micro_time(ts: float | None = None) -> str:
    dt = datetime.fromtimestamp(time.time() if ts is None else ts, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
    ):
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError(
                f"leader election: need lease_duration ({lease_duration}) > renew_deadline ({renew_deadline}) "
                f"> retry_period ({retry_period}) > 0"
            )
        self.api = client.CoordinationV1Api(_own_client(api_client))
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self._valid_until = 0.0  # monotonic
        self._renewed = threading.Condition()  # notified when _valid_until moves
        self._held: dict | None = None  # the Lease as this candidate last wrote it (the fast path)
        self._observed: tuple | None = None  # (holder, renewTime, transitions) last seen
        self._observed_at = 0.0  # monotonic time the observed record last changed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.transitions = 0  # how often this candidate became leader
        self.losses = 0  # how often its fence expired while it led
        self._missing_namespace_reported = False
        # for the cause of a lost fence
        self._last_renewed = 0.0  # monotonic start of the last successful renewal
        self._attempt_started: float | None = None  # monotonic, while a renewal is in flight
        self._last_problem = ""  # why the last attempt did not renew
        self._wake_lag = 0.0  # how late the renewal thread last woke (CPU starvation)
        self._leading = False  # a lost fence not yet reported
        self.slowest = self.latest_wake = 0.0  # the slowest renewal and the latest wake-up seen, seconds
        self._slow_logged_at = -1e9

    def is_leader(self) -> bool:
        if time.monotonic() < self._valid_until:
            return True
        if self._leading:
            self._report_lost()
        return False

    def wait_renewed(self, timeout: float) -> bool:
        """Whether the fence is valid within `timeout` s: a Binding checked while a renewal is in flight
        waits for it (bounded) instead of being refused. Never extends the fence itself."""
        deadline = time.monotonic() + timeout
        with self._renewed:
            while not self.is_leader():
                left = deadline - time.monotonic()
                if left <= 0 or self._attempt_started is None and not self._leading:
                    return False
                self._renewed.wait(min(left, 0.05))
        return True

    def _set_valid_until(self, value: float) -> None:
        with self._renewed:
            self._valid_until = value
            self._renewed.notify_all()

    def _report_lost(self, cause: str | None = None) -> None:
        with self._renewed:
            if not self._leading:
                return
            self._leading = False
            self.losses += 1
        now = time.monotonic()
        if cause is None:
            parts = [f"no successful renewal for {now - self._last_renewed:.1f}s (renew deadline "
                     f"{self.renew_deadline:g}s, retry every {self.retry_period:g}s)"]
            if self._attempt_started is not None:
                parts.append(f"a renewal in flight for {now - self._attempt_started:.1f}s (API latency)")
            if self._last_problem:
                parts.append(f"last attempt: {self._last_problem}")
            if self._wake_lag > self.retry_period / 2:
                parts.append(f"the renewal thread woke {self._wake_lag:.1f}s late (CPU starvation)")
            cause = "; ".join(parts)
        log.warning("%s lost leadership (lease %s/%s): %s; bindings stop until it is renewed",
                    self.identity, self.namespace, self.name, cause)

    def start(self) -> "LeaseElector":
        self._thread = threading.Thread(target=self._loop, name="leader-election", daemon=True)
        self._thread.start()
        return self

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=self.renew_deadline + 5)
        log.info("leader election: slowest renewal %.2fs, latest wake-up %.2fs late (renew deadline %gs)",
                 self.slowest, self.latest_wake, self.renew_deadline)
        if release and time.monotonic() < self._valid_until:
            self._release()
        self._leading = False  # a stop is not a loss
        self._set_valid_until(0.0)

    def _loop(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            started = time.monotonic()
            self._wake_lag = max(0.0, started - due)
            self._attempt_started = started
            try:
                if self.try_acquire_or_renew():
                    self._last_problem = ""
            except Exception as exc:  # noqa: BLE001 - API down: keep trying; the fence expires on its own
                self._last_problem = f"{type(exc).__name__}: {str(exc)[:200]} after {time.monotonic() - started:.1f}s"
                log.warning("leader election: %s", self._last_problem)
            finally:
                self._attempt_started = None
            self._note_timing(time.monotonic() - started)
            if self.is_leader() and not self._leading:
                self._leading = True
                self.transitions += 1
                log.info("%s became leader (lease %s/%s)", self.identity, self.namespace, self.name)
            # start to start: a slow attempt is followed at once, not after another retry_period
            due = max(started + self.retry_period, time.monotonic())
            self._stop.wait(max(0.0, due - time.monotonic()))

    def _note_timing(self, took: float) -> None:
        """Keep the worst renewal time and wake-up lag; warn (at most every 30 s) when either eats half
        the margin, before the fence lapses."""
        self.slowest, self.latest_wake = max(self.slowest, took), max(self.latest_wake, self._wake_lag)
        if took > self.renew_deadline / 2 or self._wake_lag > self.retry_period:
            now = time.monotonic()
            if now - self._slow_logged_at > 30:
                self._slow_logged_at = now
                log.warning("leader election: a renewal took %.2fs and its thread woke %.2fs late (renew deadline "
                            "%gs): the API server or this process is overloaded", took, self._wake_lag,
                            self.renew_deadline)

    def _renewed_at(self, started: float, lease: dict) -> bool:
        self._held = lease
        self._last_renewed = started
        self._set_valid_until(started + self.renew_deadline)
        return True

    def try_acquire_or_renew(self) -> bool:
        started = time.monotonic()
        now = time.time()
        timeout = self.renew_deadline  # an answer later than that cannot renew the fence anyway
        if self._held is not None:  # fast path: we wrote the Lease last; a 409 says someone else did since
            lease = self._held
            spec = lease.get("spec") or {}
            lease["spec"] = self._spec(now, acquire=spec.get("acquireTime") or now,
                                       transitions=int(spec.get("leaseTransitions") or 0))
            try:
                resp = self.api.replace_namespaced_lease(self.name, self.namespace, lease, _preload_content=False,
                                                         _request_timeout=timeout)
                return self._renewed_at(started, json.loads(resp.data))
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise
                self._held = None
        try:
            resp = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                  _request_timeout=timeout)
            lease = json.loads(resp.data)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, acquire=now, transitions=0),
            }
            try:
                resp = self.api.create_namespaced_lease(self.namespace, body, _preload_content=False,
                                                        _request_timeout=timeout)
            except ApiException as exc2:
                if exc2.status == 409:
                    return False  # someone else created it first
                if exc2.status == 404:
                    if self._missing_namespace_reported:
                        return False
                    self._missing_namespace_reported = True
                    log.error("leader election: namespace %r does not exist, so no replica can lead and nothing "
                              "is bound; create it or pass --leader-elect-namespace", self.namespace)
                    return False
                raise
            return self._renewed_at(started, json.loads(resp.data))

        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, started
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and started < self._observed_at + duration:
            self._set_valid_until(0.0)
            if self._leading:
                self._report_lost(f"the Lease is held by {holder} (it took over after this replica's renewals "
                                  f"lapsed: {self._last_problem or 'none failed, were they too slow?'})")
            return False  # held by someone else and not expired
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            acquire = spec.get("acquireTime") or _micro_time(now)
        else:
            acquire, transitions = _micro_time(now), transitions + 1
        lease["spec"] = self._spec(now, acquire=acquire, transitions=transitions)
        try:
            resp = self.api.replace_namespaced_lease(self.name, self.namespace, lease, _preload_content=False,
                                                     _request_timeout=timeout)
        except ApiException as exc:
            if exc.status == 409:
                self._set_valid_until(0.0)
                self._last_problem = "409 Conflict: another replica wrote the Lease in between"
                return False  # stale resourceVersion: someone else wrote in between
            raise
        return self._renewed_at(started, json.loads(resp.data))

    def _spec(self, now: float, acquire, transitions: int) -> dict:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, int(round(self.lease_duration))),
            "acquireTime": acquire if isinstance(acquire, str) else _micro_time(acquire),
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }

    def _release(self) -> None:
        """Give the Lease up on a clean shutdown so a standby takes over at once, not after the lease."""
        try:
            resp = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False, _request_timeout=5)
            lease = json.loads(resp.data)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"]["holderIdentity"] = ""
            lease["spec"]["leaseDurationSeconds"] = 1
            self.api.replace_namespaced_lease(self.name, self.namespace, lease, _preload_content=False, _request_timeout=5)
        except Exception as exc:  # noqa: BLE001 - best effort; the lease expires anyway
            log.info("leader election: release failed: %s", exc)
