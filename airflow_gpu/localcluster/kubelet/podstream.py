"""Pod exec, attach and port-forward over WebSocket, as kubelet's streaming server speaks them.

exec/attach: subprotocols v5.channel.k8s.io (kubectl 1.32, the Python client) and v4.channel.k8s.io.
Every message is one channel byte + data: 0 stdin, 1 stdout, 2 stderr, 3 error (a JSON Status when the
command ends: Success, or NonZeroExitCode with the exit code as a cause), 4 resize ({"Width","Height"});
v5 adds 255 = close a channel ([255, 0] closes stdin). The command runs as a subprocess in the pod's
working directory with the container's environment (with a pseudo-terminal for tty=true); attach
follows the container's output from now on (its stdin is not connected: containers start without one).

port-forward: SPDY/3.1+portforward.k8s.io (kubectl 1.31+: SPDY frames in binary messages, see
spdyforward), v4.channel.k8s.io / channel.k8s.io (what the Python client offers). Port i of the request
uses channels 2i (data) and 2i+1 (errors); each starts with a frame carrying the port number
(little-endian uint16); data goes to the pod's loopback address on that port.

Nothing here answers with a transport error: a request that cannot be served gets a Status (400,
403, 404) before the upgrade, through the ASGI WebSocket denial response.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import pty
import signal
import struct
import subprocess
import termios
from typing import Callable
from urllib.parse import parse_qs, unquote

from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.kubelet import isolation, security
from airflow_gpu.localcluster.kubelet.spdyforward import TUNNEL_PROTOCOL, SpdyPortForward
from airflow_gpu.localcluster.kubelet.upgrades import SPDY_EXTENSION
from airflow_gpu.localcluster.errors import ApiError
from airflow_gpu.localcluster.kubelet.kubelet import _die_with_parent
from airflow_gpu.localcluster.kubelet.podenv import VAR_REF
from airflow_gpu.localcluster.podutil import is_terminal

log = logging.getLogger(__name__)
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
EXEC_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")  # preference order, as the kubelet's
PORTFORWARD_PROTOCOLS = (TUNNEL_PROTOCOL, "v4.channel.k8s.io", "channel.k8s.io", "portforward.k8s.io")
SUBRESOURCES = ("exec", "attach", "portforward")
TRUE = ("true", "1", "True")
CHUNK = 32 * 1024


class Session:
    """One accepted WebSocket: framed sends, and a receive loop feeding handlers."""

    def __init__(self, receive, send, protocol: str):
        self.receive, self._send, self.protocol = receive, send, protocol
        self.closed = False

    async def send(self, channel: int, data: bytes) -> None:
        await self.send_message(bytes([channel]) + data)

    async def send_message(self, data: bytes) -> None:
        if not self.closed:
            try:
                await self._send({"type": "websocket.send", "bytes": data})
            except (OSError, RuntimeError):  # the client went away
                self.closed = True

    async def close(self, code: int = 1000) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError, RuntimeError):
                await self._send({"type": "websocket.close", "code": code})

    async def frames(self):
        """Yield (channel, data) of client messages until it disconnects."""
        while True:
            message = await self.receive()
            if message["type"] == "websocket.disconnect":
                self.closed = True
                return
            data = message.get("bytes")
            if data is None:
                data = (message.get("text") or "").encode("utf-8", "surrogateescape")
            if data:
                yield data[0], data[1:]


def exit_status(code: int, command: list[str]) -> dict:
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure",
            "message": f"command terminated with non-zero exit code: error executing command {command}, "
                       f"exit code {code}",
            "reason": "NonZeroExitCode", "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


class PodStreams:
    def __init__(self, kubelet):
        self.kubelet, self.store = kubelet, kubelet.store
        self.tasks: set[asyncio.Task] = set()

    # --- entry --------------------------------------------------------------------------------
    async def handle(self, scope, receive, send, authorize: Callable[[dict, dict], None]) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
        if SPDY_EXTENSION in (scope.get("extensions") or {}):  # a plain SPDY upgrade: port-forward only
            offered = [TUNNEL_PROTOCOL if scope["path"].endswith("/portforward") else "SPDY/3.1"]
        try:
            authorize(scope, headers)  # raises the 401/403 ApiError
            ns, name, sub = self._target(scope["path"])
            query = parse_qs(scope["query_string"].decode(), keep_blank_values=True)
            pod = self.store.get("/pods", ns, name)
            if pod is None:
                raise errors.not_found("pods", name)
            supported = PORTFORWARD_PROTOCOLS if sub == "portforward" else EXEC_PROTOCOLS
            protocol = next((p for p in supported if p in offered), None)
            if protocol is None:
                raise ApiError(400, "BadRequest", f"unable to upgrade connection: no common subprotocol: the client "
                                                  f"offered {offered or ['(none)']}, this server speaks "
                                                  f"{list(supported)}")
            run_args = self._prepare(sub, pod, query, spdy_streams=protocol == TUNNEL_PROTOCOL)
        except ApiError as exc:
            await deny(send, exc)
            return
        await send({"type": "websocket.accept", "subprotocol": protocol})
        session = Session(receive, send, protocol)
        task = asyncio.current_task()
        self.tasks.add(task)
        try:
            if sub == "exec":
                await self._exec(session, *run_args)
            elif sub == "attach":
                await self._attach(session, *run_args)
            elif protocol == TUNNEL_PROTOCOL:
                await self._spdy_tunnel(session, *run_args)
            else:
                await self._portforward(session, *run_args)
        except Exception:
            log.exception("pod %s of %s/%s failed", sub, ns, name)
            await session.send(ERROR, json.dumps(errors.ApiError(500, "InternalError", "internal error").status()).encode())
        finally:
            await session.close()
            self.tasks.discard(task)

    @staticmethod
    def _target(path: str) -> tuple[str, str, str]:
        parts = [unquote(p) for p in path.rstrip("/").split("/")[1:]]
        if len(parts) == 7 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods" and \
                parts[6] in SUBRESOURCES:
            return parts[3], parts[5], parts[6]
        raise errors.no_such_path()

    def _container(self, pod: dict, query: dict) -> dict:
        name = (query.get("container") or [""])[-1]
        containers = pod["spec"].get("containers") or []
        everything = containers + (pod["spec"].get("initContainers") or [])
        if not name:
            if len(containers) != 1:
                default = (pod["metadata"].get("annotations") or {}).get("kubectl.kubernetes.io/default-container")
                if not default:
                    raise errors.bad_request(f"a container name must be specified for pod {pod['metadata']['name']}, "
                                             f"choose one of: {[c['name'] for c in containers]}")
                name = default
            else:
                name = containers[0]["name"]
        spec = next((c for c in everything if c["name"] == name), None)
        if spec is None:
            raise errors.bad_request(f"container {name} is not valid for pod {pod['metadata']['name']}")
        return spec

    def _running(self, pod: dict, container: str):
        run = self.kubelet.runs.get(pod["metadata"]["uid"])
        c = run.containers.get(container) if run is not None else None
        if is_terminal(pod) or c is None or not c.running:
            phase = (pod.get("status") or {}).get("phase", "Pending")
            raise errors.bad_request(f'unable to upgrade connection: container "{container}" in pod '
                                     f'"{pod["metadata"]["name"]}" is not running (pod phase {phase})')
        return run, c

    def _prepare(self, sub: str, pod: dict, query: dict, spdy_streams: bool = False) -> tuple:
        flag = {k: (query.get(k) or ["false"])[-1] in TRUE for k in ("stdin", "stdout", "stderr", "tty")}
        if sub == "portforward":
            if spdy_streams:  # every SPDY stream names its port
                self.check_forwardable(pod)
                return (pod,)
            ports = []
            for value in query.get("ports") or []:
                for part in value.split(","):
                    if not part.strip().isdigit() or not 0 < int(part) < 65536:
                        raise errors.bad_request(f"ports: {part!r} is not a port number (1-65535)")
                    ports.append(int(part))
            if not ports:
                raise errors.bad_request("ports: at least one port is required (?ports=8080)")
            self.check_forwardable(pod)
            return pod, ports
        spec = self._container(pod, query)
        run, c = self._running(pod, spec["name"])
        if sub == "attach":
            return pod, run, c, flag
        command = query.get("command") or []
        if not command:
            raise errors.bad_request("you must specify at least 1 command")
        if not (flag["stdin"] or flag["stdout"] or flag["stderr"]):
            raise errors.bad_request("you must specify at least 1 of stdin, stdout, stderr")
        return pod, run, c, command, flag

    # --- exec -----------------------------------------------------------------------------------
    async def _exec(self, session: Session, pod: dict, run, c, command: list[str], flag: dict) -> None:
        env = self.kubelet.env.build(run, c, pod)
        # as the container's own processes: its user, groups, capabilities, seccomp profile (securityContext);
        # its profile was compiled when it started
        argv = security.identity(pod, c.spec, self.kubelet.can_drop_caps).argv() + [VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), a)
                                                        for a in command]
        master = None
        if self.kubelet.isolation == "mountns" and c.proc is not None:
            # a confined container: the command joins its namespaces and root (its volumes, its writes,
            # only its processes)
            init_pid = isolation.container_init_pid(c.proc.pid)
            if init_pid is None:
                gone = errors.ApiError(500, "InternalError", "Internal error occurred: error executing "
                                               "command in container: the container's process has exited")
                await session.send(ERROR, json.dumps(gone.status()).encode())
                return
            argv = isolation.exec_argv(argv)
        else:
            init_pid = None

        def enter_container():
            if init_pid is not None:
                isolation.enter(init_pid, str(run.workdir))
        try:
            if flag["tty"]:
                master, slave = pty.openpty()
                terminal = os.ttyname(slave)

                def child_setup():  # a new session whose first opened terminal becomes its controlling one
                    _die_with_parent()
                    enter_container()
                    os.setsid()
                    os.close(os.open(terminal, os.O_RDWR))
                proc = await asyncio.create_subprocess_exec(*argv, cwd=str(run.workdir), env=env, stdin=slave,
                                                            stdout=slave, stderr=slave, preexec_fn=child_setup)
                os.close(slave)
            else:
                proc = await asyncio.create_subprocess_exec(
                    *argv, cwd=str(run.workdir), env=env, start_new_session=True,
                    preexec_fn=lambda: (_die_with_parent(), enter_container()),
                    stdin=asyncio.subprocess.PIPE if flag["stdin"] else asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE if flag["stdout"] else asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE if flag["stderr"] else asyncio.subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as exc:
            if master is not None:
                os.close(master)
            why = (f'exec: "{argv[0]}": {exc.strerror}' if isinstance(exc, OSError)
                   else "joining the container's namespaces failed")
            status = errors.ApiError(500, "InternalError", f"Internal error occurred: error executing command in "
                                                           f"container: failed to exec in container: {why}").status()
            await session.send(ERROR, json.dumps(status).encode())
            return
        loop = asyncio.get_running_loop()
        pumps = []
        if master is not None:
            pumps.append(loop.create_task(self._pump_fd(master, session, STDOUT)))
        else:
            for stream, channel in ((proc.stdout, STDOUT), (proc.stderr, STDERR)):
                if stream is not None:
                    pumps.append(loop.create_task(self._pump(stream, session, channel)))
        reader = loop.create_task(self._client_input(session, proc, master))
        try:
            code = await proc.wait()
            await asyncio.wait(pumps, timeout=1.0)  # output written before the exit goes out first
        finally:
            reader.cancel()
            for task in pumps:
                task.cancel()
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            if master is not None:
                with contextlib.suppress(OSError):
                    os.close(master)
        code = 128 - code if code < 0 else code
        await session.send(ERROR, json.dumps(exit_status(code, command)).encode())

    async def _client_input(self, session: Session, proc, master: int | None) -> None:
        """stdin, resize and (v5) close messages from the client; a disconnect kills the command."""
        async for channel, data in session.frames():
            if channel == STDIN:
                if master is not None:
                    await asyncio.get_running_loop().run_in_executor(None, os.write, master, data)
                elif proc.stdin is not None and not proc.stdin.is_closing():
                    proc.stdin.write(data)
                    with contextlib.suppress(ConnectionError):
                        await proc.stdin.drain()
            elif channel == RESIZE and master is not None:
                with contextlib.suppress(ValueError, OSError, TypeError):
                    size = json.loads(data)
                    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", int(size["Height"]),
                                                                       int(size["Width"]), 0, 0))
            elif channel == CLOSE and data[:1] == bytes([STDIN]) and proc.stdin is not None:
                proc.stdin.close()
        if proc.returncode is None:  # the client is gone: nobody reads what the command writes
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    @staticmethod
    async def _pump(stream: asyncio.StreamReader, session: Session, channel: int) -> None:
        while True:
            data = await stream.read(CHUNK)
            if not data:
                return
            await session.send(channel, data)

    @staticmethod
    async def _pump_fd(fd: int, session: Session, channel: int) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = await loop.run_in_executor(None, os.read, fd, CHUNK)
            except OSError:  # EIO: the terminal's last writer closed it
                return
            if not data:
                return
            await session.send(channel, data)

    # --- attach ---------------------------------------------------------------------------------
    async def _attach(self, session: Session, pod: dict, run, c, flag: dict) -> None:
        if c.log_path is None:
            await session.send(ERROR, json.dumps(exit_status(0, [])).encode())
            return
        size = c.log_path.stat().st_size if c.log_path.exists() else 0
        loop = asyncio.get_running_loop()
        drain = loop.create_task(self._discard_input(session))
        try:
            with open(c.log_path, "rb") as fh:
                fh.seek(size)  # attach shows output from now on, as a terminal joining late
                pending = b""
                while not session.closed:
                    chunk = fh.read()
                    if chunk:
                        lines = (pending + chunk).splitlines(keepends=True)
                        pending = lines.pop() if lines and not lines[-1].endswith(b"\n") else b""
                        for record in lines:
                            stream, text = _record(record)
                            if text is not None and (flag["stdout"] if stream == b"stdout" else flag["stderr"]):
                                await session.send(STDOUT if stream == b"stdout" or flag["tty"] else STDERR, text)
                        continue
                    if c.done.is_set():
                        break
                    await asyncio.sleep(0.1)
        finally:
            drain.cancel()
        await session.send(ERROR, json.dumps(exit_status(c.exit_code or 0, [])).encode())

    @staticmethod
    async def _discard_input(session: Session) -> None:
        async for _ in session.frames():
            pass

    # --- port-forward -----------------------------------------------------------------------------
    @staticmethod
    def check_forwardable(pod: dict) -> None:
        if (pod.get("status") or {}).get("phase") != "Running":
            raise errors.bad_request(f"unable to upgrade connection: pod {pod['metadata']['name']} is not "
                                     f"running (phase {(pod.get('status') or {}).get('phase', 'Pending')})")

    async def _spdy_tunnel(self, session: Session, pod: dict) -> None:
        """kubectl 1.31+: SPDY frames carried in WebSocket binary messages, no channel byte."""
        async def recv() -> bytes | None:
            while True:
                message = await session.receive()
                if message["type"] == "websocket.disconnect":
                    session.closed = True
                    return None
                data = message.get("bytes")
                if data:
                    return data

        await SpdyPortForward(pod["metadata"]["name"], lambda port: dial_pod(pod, port), recv,
                              session.send_message).serve()

    async def _portforward(self, session: Session, pod: dict, ports: list[int]) -> None:
        writers: dict[int, asyncio.StreamWriter] = {}
        loop = asyncio.get_running_loop()
        pumps = []
        for index, port in enumerate(ports):
            data_channel, error_channel = 2 * index, 2 * index + 1
            header = struct.pack("<H", port)
            await session.send(data_channel, header)
            await session.send(error_channel, header)
            connection = await dial_pod(pod, port)
            if isinstance(connection, str):
                await session.send(error_channel, connection.encode())
                continue
            reader, writer = connection
            writers[data_channel] = writer
            pumps.append(loop.create_task(self._pump(reader, session, data_channel)))
        async def forward():
            async for channel, data in session.frames():
                writer = writers.get(channel)
                if writer is not None and not writer.is_closing():
                    writer.write(data)
                    with contextlib.suppress(ConnectionError):
                        await writer.drain()

        inbound = loop.create_task(forward())
        outbound = None
        try:
            # the stream ends when the client goes, or when every pod-side connection has closed
            outbound = loop.create_task(asyncio.wait(pumps)) if pumps else None
            await asyncio.wait([t for t in (inbound, outbound) if t], return_when=asyncio.FIRST_COMPLETED)
        finally:
            inbound.cancel()
            if outbound is not None:
                outbound.cancel()
            for task in pumps:
                task.cancel()
            for writer in writers.values():
                writer.close()

    def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()


async def dial_pod(pod: dict, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | str:
    """A connection to the pod's port, or the kubelet's error message when nothing listens there."""
    for host in ("127.0.0.1", (pod.get("status") or {}).get("podIP")):  # the pod's loopback first
        if not host:
            continue
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            return await asyncio.wait_for(asyncio.open_connection(host, port), 5)
    return (f"error forwarding port {port} to pod {pod['metadata']['name']}, uid {pod['metadata']['uid']}: "
            f"dial tcp4 127.0.0.1:{port}: connect: connection refused")


def _record(record: bytes) -> tuple[bytes, bytes | None]:
    parts = record.rstrip(b"\n").split(b" ", 3)
    if len(parts) < 3:
        return b"", None
    text = parts[3] if len(parts) == 4 else b""
    return parts[1], text + (b"\n" if parts[2] == b"F" else b"")


async def deny(send, exc: ApiError) -> None:
    """Refuse the upgrade with a Status (ASGI WebSocket denial response), never a bare transport error."""
    body = json.dumps(exc.status()).encode()
    await send({"type": "websocket.http.response.start", "status": exc.code,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "websocket.http.response.body", "body": body})
