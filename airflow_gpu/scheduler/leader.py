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
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime, timezone

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)


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
        self.api = client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self._valid_until = 0.0  # monotonic
        self._observed: tuple | None = None  # (holder, renewTime, transitions) last seen
        self._observed_at = 0.0  # monotonic time the observed record last changed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.transitions = 0  # how often this candidate became leader
        self._missing_namespace_reported = False

    def is_leader(self) -> bool:
        return time.monotonic() < self._valid_until

    def start(self) -> "LeaseElector":
        self._thread = threading.Thread(target=self._loop, name="leader-election", daemon=True)
        self._thread.start()
        return self

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=self.retry_period + 5)
        if release and self.is_leader():
            self._release()
        self._valid_until = 0.0

    def _loop(self) -> None:
        while not self._stop.is_set():
            was = self.is_leader()
            try:
                self.try_acquire_or_renew()
            except Exception as exc:  # noqa: BLE001 - API down: keep trying; the fence expires on its own
                log.warning("leader election: %s: %s", type(exc).__name__, exc)
            now = self.is_leader()
            if now and not was:
                self.transitions += 1
                log.info("%s became leader (lease %s/%s)", self.identity, self.namespace, self.name)
            elif was and not now:
                log.warning("%s lost leadership", self.identity)
            self._stop.wait(self.retry_period)

    def try_acquire_or_renew(self) -> bool:
        started = time.monotonic()
        now = time.time()
        try:
            resp = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False, _request_timeout=5)
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
                self.api.create_namespaced_lease(self.namespace, body, _preload_content=False, _request_timeout=5)
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
            self._valid_until = started + self.renew_deadline
            return True

        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, started
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and started < self._observed_at + duration:
            self._valid_until = 0.0
            return False  # held by someone else and not expired
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            acquire = spec.get("acquireTime") or _micro_time(now)
        else:
            acquire, transitions = _micro_time(now), transitions + 1
        lease["spec"] = self._spec(now, acquire=acquire, transitions=transitions)
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease, _preload_content=False, _request_timeout=5)
        except ApiException as exc:
            if exc.status == 409:
                self._valid_until = 0.0
                return False  # stale resourceVersion: someone else wrote in between
            raise
        self._valid_until = started + self.renew_deadline
        return True

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
