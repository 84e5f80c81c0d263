"""In-memory object store: one global resourceVersion counter, watch fan-out, optional persistence.

Like etcd behind a real API server: every write gets the next resourceVersion; a bounded history of
events lets a watch resume from a recent resourceVersion (older ones get 410 Gone); objects are kept
as dicts plus their JSON bytes (encoded once, reused by every list and watch). With a state dir
every write is appended to a log that is replayed at start, so a restarted API server keeps its state
and its recent watch history.

Durability: the API server answers a write only after `durable()` returns, i.e. after the write is in
the log (group commit: all writes of one event-loop turn go out in one write(2)). With fsync=False
(the default) an answered write survives a kill -9 of the server (it is in the kernel's page cache);
with fsync=True it also survives a power cut (fdatasync before the answer). Files are 0600 in a 0700
dir: the log holds every Secret.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
from collections import defaultdict
from pathlib import Path
from typing import Callable

import msgspec

from airflow_gpu.constants import ENV_CLUSTER_UNSAFE_ACK
from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.registry.selectors import fields_match, labels_match

log = logging.getLogger(__name__)


class CorruptLog(RuntimeError):
    """A line in the middle of store.log cannot be parsed: the rest is not replayed and nothing is cut."""
encode = msgspec.json.Encoder().encode
decode = msgspec.json.decode

WATCH_QUEUE_LIMIT = 50_000  # a watcher this far behind is closed, as the real server drops slow watchers


class Entry:
    __slots__ = ("obj", "_raw")

    def __init__(self, obj: dict, raw: bytes | None = None):
        self.obj = obj
        self._raw = raw

    @property
    def raw(self) -> bytes:
        if self._raw is None:
            self._raw = encode(self.obj)
        return self._raw


_UNSAFE_ACK = os.environ.get(ENV_CLUSTER_UNSAFE_ACK) == "1"


class Event:
    __slots__ = ("rv", "key", "type", "entry", "old")

    def __init__(self, rv: int, key: str, etype: str, entry: Entry, old: dict | None):
        self.rv, self.key, self.type, self.entry, self.old = rv, key, etype, entry, old


class Watcher:
    """One watch stream's filter and queue. The queue holds (type, Entry); None ends the stream."""

    def __init__(self, store: "Store", key: str, namespace: str | None, label_reqs=(), field_reqs=()):
        self.store, self.key, self.namespace = store, key, namespace
        self.label_reqs, self.field_reqs = label_reqs, field_reqs
        self.queue: asyncio.Queue = asyncio.Queue()
        self.closed = False

    def _match(self, obj: dict | None) -> bool:
        if obj is None:
            return False
        meta = obj["metadata"]
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        if self.label_reqs and not labels_match(self.label_reqs, meta.get("labels")):
            return False
        return not self.field_reqs or fields_match(self.field_reqs, obj)

    def offer(self, etype: str, entry: Entry, old: dict | None) -> None:
        if self.closed:
            return
        new_ok = self._match(entry.obj)
        if etype == "MODIFIED" and (self.label_reqs or self.field_reqs):
            old_ok = self._match(old)
            if not new_ok and not old_ok:
                return
            if not old_ok:
                etype = "ADDED"
            elif not new_ok:
                etype = "DELETED"  # left the selection, as the real watch cache reports it
        elif not new_ok:
            return
        if self.queue.qsize() > WATCH_QUEUE_LIMIT:
            self.close()
            return
        self.queue.put_nowait((etype, entry))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(None)
            self.store.watchers[self.key].discard(self)


Listener = Callable[[str, str, dict, "dict | None"], None]  # (event type, resource key, obj, old)


class Store:
    def __init__(self, state_dir: Path | None = None, history_size: int = 20_000,
                 compact_bytes: int = 64 * 1024 * 1024, fsync: bool = False,
                 share: dict[str, Callable[[dict, dict | None], None]] | None = None):
        # resource key -> hook(new object, stored version or None) that points the values an object
        # repeats from others at one shared copy (shared.py)
        self.share = share or {}
        self.rv = 0
        self.objects: dict[str, dict[tuple[str, str], Entry]] = defaultdict(dict)
        self.history: list[Event] = []
        self.history_rvs: list[int] = []
        self.history_size = history_size
        self.compacted_rv = 0  # watches must start at or after this resourceVersion
        self.watchers: dict[str, set[Watcher]] = defaultdict(set)
        self.listeners: list[Listener] = []
        self.log_path = Path(state_dir) / "store.log" if state_dir else None
        self._log_buffer: list[bytes] = []
        self._log_file = None
        self._flush_handle = None
        self.fsync = fsync
        self._seq = 0  # writes recorded ...
        self._logged_seq = 0  # ... and of those, in the log
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self.compact_bytes = compact_bytes  # rewrite the log as a snapshot once it is this big ...
        self._log_bytes = 0
        self._snapshot_bytes = 0  # ... and 4 times the last snapshot

    # --- reads -----------------------------------------------------------------------------
    def get(self, key: str, namespace: str, name: str) -> dict | None:
        entry = self.objects[key].get((namespace, name))
        return entry.obj if entry else None

    def get_entry(self, key: str, namespace: str, name: str) -> Entry | None:
        return self.objects[key].get((namespace, name))

    def entries(self, key: str, namespace: str | None = None) -> list[Entry]:
        items = self.objects[key]
        if namespace is None:
            return list(items.values())
        return [e for (ns, _), e in items.items() if ns == namespace]

    def values(self, key: str, namespace: str | None = None) -> list[dict]:
        return [e.obj for e in self.entries(key, namespace)]

    # --- writes ----------------------------------------------------------------------------
    def _next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def create(self, key: str, obj: dict, plural: str = "", group: str = "") -> dict:
        meta = obj["metadata"]
        ident = (meta.get("namespace", ""), meta["name"])
        if ident in self.objects[key]:
            raise errors.already_exists(plural or key, meta["name"], group)
        rv = self._next_rv()
        meta["resourceVersion"] = str(rv)
        if key in self.share:
            self.share[key](obj, None)
        entry = Entry(obj)
        self.objects[key][ident] = entry
        self._record(rv, key, "ADDED", entry, None, ident)
        return obj

    def update(self, key: str, obj: dict, plural: str = "", group: str = "", expect_rv: str | None = None) -> dict:
        """Replace the object. expect_rv: optimistic concurrency (409 Conflict when stale)."""
        meta = obj["metadata"]
        ident = (meta.get("namespace", ""), meta["name"])
        current = self.objects[key].get(ident)
        if current is None:
            raise errors.not_found(plural or key, meta["name"], group)
        if expect_rv and expect_rv != current.obj["metadata"]["resourceVersion"]:
            raise errors.conflict(plural or key, meta["name"], group)
        rv = self._next_rv()
        meta["resourceVersion"] = str(rv)
        if key in self.share:
            self.share[key](obj, current.obj)
        entry = Entry(obj)
        self.objects[key][ident] = entry
        self._record(rv, key, "MODIFIED", entry, current.obj, ident)
        return obj

    def delete(self, key: str, namespace: str, name: str, plural: str = "", group: str = "") -> dict:
        current = self.objects[key].pop((namespace, name), None)
        if current is None:
            raise errors.not_found(plural or key, name, group)
        rv = self._next_rv()
        # the DELETED event carries the object at the deletion's resourceVersion
        obj = dict(current.obj)
        obj["metadata"] = {**obj["metadata"], "resourceVersion": str(rv)}
        entry = Entry(obj)
        self._record(rv, key, "DELETED", entry, current.obj, (namespace, name))
        return obj

    def _record(self, rv: int, key: str, etype: str, entry: Entry, old: dict | None, ident) -> None:
        event = Event(rv, key, etype, entry, old)
        self.history.append(event)
        self.history_rvs.append(rv)
        if len(self.history) > 2 * self.history_size:
            cut = len(self.history) - self.history_size
            self.compacted_rv = self.history_rvs[cut - 1]
            del self.history[:cut]
            del self.history_rvs[:cut]
        for watcher in tuple(self.watchers.get(key, ())):
            watcher.offer(etype, entry, old)
        for listener in self.listeners:
            try:
                listener(etype, key, entry.obj, old)
            except Exception:  # a broken controller must not break the API server
                log.exception("store listener failed")
        if self.log_path is not None:
            self._log_buffer.append(encode([rv, etype[0], key, ident[0], ident[1],
                                            None if etype == "DELETED" else entry.obj]))
            self._seq += 1
            self._schedule_flush()

    # --- watch -----------------------------------------------------------------------------
    def watch(self, key: str, namespace: str | None, label_reqs=(), field_reqs=(), since: int | None = None,
              initial: list[Entry] | None = None) -> Watcher:
        """Register a watcher. since: replay history after this resourceVersion (410 if too old);
        initial: synthetic ADDED events first (watch without resourceVersion)."""
        if since is not None and since < self.compacted_rv:
            raise errors.gone(f"too old resource version: {since} ({self.compacted_rv})")
        watcher = Watcher(self, key, namespace, label_reqs, field_reqs)
        if initial is not None:
            for entry in initial:
                if watcher._match(entry.obj):
                    watcher.queue.put_nowait(("ADDED", entry))
        elif since is not None:
            start = bisect.bisect_right(self.history_rvs, since)
            for event in self.history[start:]:
                if event.key == key:
                    watcher.offer(event.type, event.entry, event.old)
        self.watchers[key].add(watcher)
        return watcher

    def close_watchers(self) -> None:
        for watchers in list(self.watchers.values()):
            for watcher in list(watchers):
                watcher.close()

    # --- persistence -----------------------------------------------------------------------
    def _schedule_flush(self) -> None:
        if self._flush_handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        # group commit: every write of this loop turn (and of requests parsed meanwhile) in one append
        self._flush_handle = loop.call_soon(self.flush)

    async def durable(self) -> None:
        """Return once every write recorded so far is in the log (answers to writes wait on this)."""
        if self.log_path is None or self._logged_seq >= self._seq:
            return
        if _UNSAFE_ACK:  # benchmark baseline: the write goes out after the answer
            self._schedule_flush()
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((self._seq, future))
        self._schedule_flush()
        await future

    def flush(self) -> None:
        self._flush_handle = None
        if not self._log_buffer or self.log_path is None:
            self._wake_waiters()
            return
        if self._log_file is None:
            _private_dir(self.log_path.parent)
            self._log_file = open(os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")
        data = b"\n".join(self._log_buffer) + b"\n"
        self._log_buffer.clear()
        self._log_file.write(data)
        self._log_file.flush()
        if self.fsync:
            os.fdatasync(self._log_file.fileno())
        self._logged_seq = self._seq
        self._log_bytes += len(data)
        if self._log_bytes > max(self.compact_bytes, 4 * self._snapshot_bytes):
            self._log_file.close()
            self._log_file = None
            self._write_snapshot()  # the in-memory watch history stays; a restart starts after the snapshot
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        waiting, self._waiters = self._waiters, []
        for seq, future in waiting:
            if seq <= self._logged_seq or self.log_path is None:
                if not future.done():
                    future.set_result(None)
            else:
                self._waiters.append((seq, future))

    def close(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self.flush()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def load(self) -> bool:
        """Replay the state dir's log (objects and recent history). Returns whether there was one."""
        self.close()
        self.objects.clear()
        self.history.clear()
        self.history_rvs.clear()
        self.rv = self.compacted_rv = 0
        if self.log_path is None or not self.log_path.exists():
            return False
        good_bytes = 0
        with open(self.log_path, "rb") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.endswith(b"\n"):
                    break  # torn last write of a killed server: never answered, so never acknowledged
                try:
                    write = decode(line)
                except (msgspec.DecodeError, ValueError, TypeError):
                    raise self._corrupt(lineno, line, "cannot parse this line") from None
                problem = _write_problem(write, self.rv, self.compacted_rv)
                if problem:
                    raise self._corrupt(lineno, line, f"not a valid write: {problem}")
                rv, op, key, ns, name, obj = write
                good_bytes += len(line)
                self._replay(rv, op, key, ns, name, obj)
        if good_bytes != self.log_path.stat().st_size:  # keep the torn tail aside, cut it so appends parse
            with open(self.log_path, "rb") as fh:
                fh.seek(good_bytes)
                torn = fh.read()
            _write_private(self.log_path.with_suffix(".torn"), torn)
            log.warning("%s: set aside a torn last line of %d bytes (store.torn)", self.log_path, len(torn))
            os.truncate(self.log_path, good_bytes)
        self._log_bytes = good_bytes
        if good_bytes > self.compact_bytes:
            self._write_snapshot()
            self.history.clear()
            self.history_rvs.clear()
            self.compacted_rv = self.rv
        return True

    def _corrupt(self, lineno: int, line: bytes, problem: str) -> CorruptLog:
        return CorruptLog(f"{self.log_path}:{lineno}: {problem} ({line[:60]!r}...); nothing was loaded or changed. "
                          "Repair or delete that line (each line is one write: [resourceVersion, op, key, namespace, "
                          "name, object]), or start with --fresh to discard the stored state")

    def _replay(self, rv: int, op: str, key: str, ns: str, name: str, obj: dict | None) -> None:
        if op == "S":  # snapshot marker: history before this point is gone
            self.compacted_rv = rv
            self.rv = max(self.rv, rv)
            return
        self.rv = max(self.rv, rv)
        old = self.objects[key].get((ns, name))
        if op == "D":
            if old is None:
                return
            self.objects[key].pop((ns, name))
            gone_obj = dict(old.obj)
            gone_obj["metadata"] = {**old.obj["metadata"], "resourceVersion": str(rv)}
            self._remember(Event(rv, key, "DELETED", Entry(gone_obj), old.obj))
        else:
            if key in self.share:
                self.share[key](obj, old.obj if old else None)
            entry = Entry(obj)
            self.objects[key][(ns, name)] = entry
            if rv <= self.compacted_rv:  # part of a snapshot, not history
                return
            self._remember(Event(rv, key, "MODIFIED" if old else "ADDED", entry, old.obj if old else None))

    def _remember(self, event: Event) -> None:
        self.history.append(event)
        self.history_rvs.append(event.rv)
        if len(self.history) > 2 * self.history_size:
            cut = len(self.history) - self.history_size
            self.compacted_rv = self.history_rvs[cut - 1]
            del self.history[:cut]
            del self.history_rvs[:cut]

    def _write_snapshot(self) -> None:
        """Replace the log by the current objects behind a snapshot marker (resourceVersions kept)."""
        tmp = self.log_path.with_suffix(".tmp")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
            fh.write(encode([self.rv, "S", "", "", "", None]) + b"\n")
            for key, items in self.objects.items():
                for (ns, name), entry in items.items():
                    rv = int(entry.obj["metadata"]["resourceVersion"])
                    fh.write(encode([rv, "P", key, ns, name])[:-1] + b"," + entry.raw + b"]\n")
            fh.flush()
            if self.fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, self.log_path)
        self._snapshot_bytes = self._log_bytes = self.log_path.stat().st_size


WRITE_OPS = ("A", "M", "D", "S", "P")  # ADDED, MODIFIED, DELETED, snapshot marker, an object of the snapshot


def _write_problem(write, last_rv: int, snapshot_rv: int) -> str | None:
    """What makes a parsed store.log line something `_write_snapshot`/`_record` never wrote, or None.
    Replaying such a line would crash start (or a controller later) with a traceback instead."""
    if not isinstance(write, list) or len(write) != 6:
        return f"expected a list of 6 items, got {type(write).__name__}" + \
            (f" of {len(write)}" if isinstance(write, list) else "")
    rv, op, key, ns, name, obj = write
    if op not in WRITE_OPS:
        return f"op {str(op)[:20]!r} is not one of {', '.join(WRITE_OPS)}"
    if isinstance(rv, bool) or not isinstance(rv, int) or rv < 0:
        return f"resourceVersion {str(rv)[:20]!r} is not a non-negative integer"
    if op == "S":
        return None if obj is None else "a snapshot marker carries no object"
    if op == "P" and rv > snapshot_rv:
        return f"resourceVersion {rv} of a snapshot object is past the snapshot's {snapshot_rv}"
    if op != "P" and rv <= last_rv:
        return f"resourceVersion {rv} does not follow the previous write's {last_rv}"
    if not (isinstance(key, str) and "/" in key and isinstance(ns, str) and isinstance(name, str) and name):
        return "key, namespace and name must be strings (key like /pods or apps/deployments, name not empty)"
    if op == "D":
        return None if obj is None else "a deletion carries no object"
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return "the object must be a JSON object with metadata"
    if meta.get("name") != name or meta.get("namespace", "") != ns:
        return f"the object's metadata names {meta.get('namespace', '')}/{meta.get('name')}, the line {ns}/{name}"
    if meta.get("resourceVersion") != str(rv):
        return f"the object's resourceVersion {str(meta.get('resourceVersion'))[:20]!r} is not the line's {rv}"
    for field in ("spec", "status"):
        if field in obj and not isinstance(obj[field], dict):
            return f"the object's {field} must be a JSON object"
    for field in ("labels", "annotations"):
        if meta.get(field) is not None and not isinstance(meta[field], dict):
            return f"the object's metadata.{field} must be a JSON object"
    return None


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _write_private(path: Path, data: bytes) -> None:
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
        fh.write(data)
