"""Child processes that are started, waited for and stopped by PID (tests and `make demo`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 30.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:.0f}s")


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.2, what: str = "condition"):
    """Call `predicate` until it returns something truthy; return that, or raise after `timeout`.
    `what` names the condition in the error; a callable is asked only then (e.g. to show an object)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    described = what() if callable(what) else what
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {described} (last: {last!r})")


def wait_for_http(url: str, timeout: float = 60.0, ok_statuses: tuple[int, ...] = (200,)) -> None:
    deadline = time.monotonic() + timeout
    last_error: object = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status in ok_statuses:
                    return
                last_error = response.status
        except urllib.error.HTTPError as exc:
            if exc.code in ok_statuses:
                return
            last_error = exc.code
        except OSError as exc:
            last_error = exc
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer {ok_statuses} within {timeout:.0f}s (last: {last_error})")


@dataclass
class ManagedProcess:
    """A child process in its own process group, so stop() reaches everything it spawned."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: str | None = None
    popen: subprocess.Popen | None = field(default=None, init=False)

    def start(self) -> "ManagedProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
        """Signal the whole process group, wait, then SIGKILL what is left. Returns the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            _signal_group(self.popen.pid, sig)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        # children that outlived the leader, or a leader that ignored SIGTERM
        _signal_group(self.popen.pid, signal.SIGKILL)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        return self.popen.returncode

    def kill9(self) -> None:
        """kill -9 of the leader alone, as a crash would (fault-injection tests)."""
        if self.popen is not None and self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> "ManagedProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
