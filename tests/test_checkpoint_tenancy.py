"""Checkpoints are per team, on a real SeaweedFS: team A's credentials cannot list, read or write team
B's bucket (S3, copy, multipart, IAM), and a process with no secrets at all, as a local-cluster pod on
the host network, is refused by every other port: filer HTTP (TCP and unix socket) and volume HTTP
without a JWT, master / volume / filer / S3 / admin gRPC without the client certificate. The Secret of a
team namespace holds that team's key and nothing else."""

from __future__ import annotations

import base64
import json

import grpc
import numpy as np
import pytest
import requests
from botocore.exceptions import ClientError

from airflow_gpu.checkpoint import Checkpointer, CheckpointStore
from airflow_gpu.devtools.seaweedfs import SeaweedFS, create_team_secrets

MANIFEST_SUFFIX = ".json"


@pytest.fixture(scope="module")
def teams(seaweedfs: SeaweedFS):
    """Teams a and b, each with one real checkpoint written by the library with its own credentials."""
    out = {}
    for name in ("tenancy-a", "tenancy-b"):
        team = seaweedfs.add_team(name, f"{name}-ckpt")
        uri = f"s3://{team.bucket}/run"
        with Checkpointer(uri, attempt=1, handle_sigterm=False, **seaweedfs.client_options(name)) as ckpt:
            ckpt.save(7, {"weights": np.frombuffer(b"secret weights of " + name.encode(), dtype=np.uint8)})
        out[name] = (team, uri)
    return out


def object_keys(seaweedfs: SeaweedFS, bucket: str) -> dict[str, bytes]:
    """Every object of a bucket and its bytes, read with the admin identity."""
    client = seaweedfs.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    return {k: client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def refused(call) -> str:
    with pytest.raises(ClientError) as err:
        call()
    return err.value.response["Error"]["Code"]


def test_a_team_cannot_list_read_or_write_another_teams_checkpoints_over_s3(seaweedfs, teams):
    (a, a_uri), (b, b_uri) = teams["tenancy-a"], teams["tenancy-b"]
    before = object_keys(seaweedfs, b.bucket)
    assert any(k.endswith(MANIFEST_SUFFIX) for k in before) and len(before) >= 2
    key = next(k for k in before if k.endswith(MANIFEST_SUFFIX))
    s3a = seaweedfs.client(team=a.name)

    # control: a's own bucket works for every call the library makes, b's key reads b
    s3a.put_object(Bucket=a.bucket, Key="run/x", Body=b"1", IfNoneMatch="*")
    upload = s3a.create_multipart_upload(Bucket=a.bucket, Key="run/mp")["UploadId"]
    assert [u["UploadId"] for u in s3a.list_multipart_uploads(Bucket=a.bucket)["Uploads"]] == [upload]
    s3a.abort_multipart_upload(Bucket=a.bucket, Key="run/mp", UploadId=upload)
    s3a.delete_objects(Bucket=a.bucket, Delete={"Objects": [{"Key": "run/x"}]})
    assert seaweedfs.client(team=b.name).get_object(Bucket=b.bucket, Key=key)["Body"].read() == before[key]

    assert refused(lambda: s3a.list_objects_v2(Bucket=b.bucket)) == "AccessDenied"
    assert refused(lambda: s3a.list_objects_v2(Bucket=b.bucket, Prefix="run/")) == "AccessDenied"
    assert refused(lambda: s3a.get_object(Bucket=b.bucket, Key=key)) == "AccessDenied"
    assert refused(lambda: s3a.head_object(Bucket=b.bucket, Key=key)) in ("403", "AccessDenied")
    assert refused(lambda: s3a.copy_object(Bucket=a.bucket, Key="stolen", CopySource={"Bucket": b.bucket, "Key": key}))
    assert refused(lambda: s3a.put_object(Bucket=b.bucket, Key=key, Body=b"planted")) == "AccessDenied"
    assert refused(lambda: s3a.put_object(Bucket=b.bucket, Key="run/planted.json", Body=b"{}")) == "AccessDenied"
    assert refused(lambda: s3a.create_multipart_upload(Bucket=b.bucket, Key="run/planted")) == "AccessDenied"
    assert refused(lambda: s3a.list_multipart_uploads(Bucket=b.bucket)) == "AccessDenied"
    assert refused(lambda: s3a.delete_object(Bucket=b.bucket, Key=key)) == "AccessDenied"
    try:  # DeleteObjects may answer 200 with a per-key error
        answer = s3a.delete_objects(Bucket=b.bucket, Delete={"Objects": [{"Key": key}]})
        assert answer.get("Errors") and not answer.get("Deleted"), answer
    except ClientError as err:
        assert err.response["Error"]["Code"] == "AccessDenied"
    assert refused(lambda: s3a.create_bucket(Bucket="tenancy-a-extra")) == "AccessDenied"
    assert [x["Name"] for x in s3a.list_buckets()["Buckets"]] == [a.bucket]
    # the library itself, with a's credentials on b's URI, finds nothing it may read
    with pytest.raises(Exception, match="(?i)access ?denied|403"), \
            CheckpointStore(b_uri, **seaweedfs.client_options(a.name)) as foreign:
        foreign.latest()

    # nor can a widen its own rights through the IAM API on the same port
    iam = seaweedfs.client("iam", team=a.name)
    for call in (lambda: iam.create_access_key(UserName=b.name),
                 lambda: iam.put_user_policy(UserName=a.name, PolicyName="all", PolicyDocument=json.dumps(
                     {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]})),
                 lambda: iam.create_user(UserName="tenancy-evil"), lambda: iam.list_access_keys(UserName=b.name)):
        with pytest.raises(ClientError):
            call()
    assert refused(lambda: s3a.get_object(Bucket=b.bucket, Key=key)) == "AccessDenied"
    assert len(seaweedfs.client("iam").list_access_keys(UserName=b.name)["AccessKeyMetadata"]) == 1

    assert object_keys(seaweedfs, b.bucket) == before  # nothing planted, changed or deleted


def _field(message: bytes, number: int) -> list[bytes]:
    """The length-delimited fields `number` of a protobuf message (enough to walk filer_pb.Entry)."""
    out, i = [], 0
    while i < len(message):
        tag, i = _varint(message, i)
        kind = tag & 7
        if kind == 0:
            _, i = _varint(message, i)
        elif kind == 1:
            i += 8
        elif kind == 5:
            i += 4
        else:
            size, i = _varint(message, i)
            if tag >> 3 == number:
                out.append(message[i:i + size])
            i += size
    return out


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _string(number: int, value: str) -> bytes:
    raw = value.encode()
    return bytes([number << 3 | 2, len(raw)]) + raw


def lookup(seaweedfs: SeaweedFS, channel: grpc.Channel, path: str) -> bytes:
    """filer_pb.SeaweedFiler/LookupDirectoryEntry(directory, name) -> the response bytes."""
    directory, _, name = path.rpartition("/")
    call = channel.unary_unary("/filer_pb.SeaweedFiler/LookupDirectoryEntry")
    return call(_string(1, directory) + _string(2, name), timeout=5)


def mtls_channel(seaweedfs: SeaweedFS, port: int) -> grpc.Channel:
    tls = {k: p.read_bytes() for k, p in seaweedfs.tls.items()}
    creds = grpc.ssl_channel_credentials(tls["ca"], tls["key"], tls["cert"])
    return grpc.secure_channel(f"127.0.0.1:{port}", creds, options=[("grpc.ssl_target_name_override", "localhost")])


def test_filer_and_volume_ports_refuse_unauthenticated_reads_and_writes(seaweedfs, teams):
    b, _ = teams["tenancy-b"]
    before = object_keys(seaweedfs, b.bucket)
    key = next(k for k in before if not k.endswith(MANIFEST_SUFFIX))  # the data object
    secret = before[key]
    path = f"/buckets/{b.bucket}/{key}"
    filer, volume, master = (seaweedfs.ports[p] for p in ("filer.port", "volume.port", "master.port"))

    def no_content(r: requests.Response) -> None:
        assert r.status_code in (401, 403), (r.status_code, r.text[:200])
        assert secret not in r.content

    plain = requests.Session()
    plain.trust_env = False
    base = f"http://127.0.0.1:{filer}"
    no_content(plain.get(base + path))
    no_content(plain.get(f"{base}/buckets/{b.bucket}/run/", headers={"Accept": "application/json"}))
    no_content(plain.put(base + path, data=b"planted"))
    no_content(plain.post(f"{base}/buckets/{b.bucket}/run/planted.json", files={"file": ("m", b"{}")}))
    no_content(plain.delete(base + path))
    sock = seaweedfs.root / "filer.sock"  # the same filer on its unix socket
    no_content(_unix_http(sock, "GET", path))
    no_content(_unix_http(sock, "GET", f"/buckets/{b.bucket}/run/"))
    no_content(_unix_http(sock, "PUT", path, b"planted"))
    no_content(_unix_http(sock, "DELETE", path))

    # the object's volume file id, from the filer's metadata over mTLS gRPC (what a pod cannot do)
    entry = _field(lookup(seaweedfs, mtls_channel(seaweedfs, seaweedfs.ports["filer.port.grpc"]), path), 1)[0]
    fids = [_field(chunk, 1)[0].decode() for chunk in _field(entry, 3)]
    assert fids and all("," in f for f in fids), entry[:200]
    token = plain.get(f"http://127.0.0.1:{master}/dir/assign").headers.get("Authorization")  # a token, for another fid
    assert token
    for fid in fids:
        no_content(plain.get(f"http://127.0.0.1:{volume}/{fid}"))
        no_content(plain.get(f"http://127.0.0.1:{volume}/{fid}", headers={"Authorization": token}))
        no_content(plain.get(f"http://127.0.0.1:{master}/{fid}"))
        no_content(plain.post(f"http://127.0.0.1:{volume}/{fid}", files={"file": ("x", b"planted")}))
        no_content(plain.post(f"http://127.0.0.1:{volume}/{fid}", files={"file": ("x", b"planted")},
                              headers={"Authorization": token}))
        no_content(plain.delete(f"http://127.0.0.1:{volume}/{fid}"))

    assert object_keys(seaweedfs, b.bucket) == before


def _unix_http(sock, method: str, path: str, body: bytes = b"") -> requests.Response:
    """One HTTP/1.1 request over a unix socket, as a requests.Response (status and content only)."""
    import http.client
    import socket

    class Conn(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(5)
            self.sock.connect(str(sock))

    conn = Conn("localhost")
    conn.request(method, path, body=body or None)
    raw = conn.getresponse()
    r = requests.Response()
    r.status_code, r._content = raw.status, raw.read()
    conn.close()
    return r


GRPC = {  # one real method per server: refused before it is reached unless the client has the certificate
    "filer.port.grpc": "/filer_pb.SeaweedFiler/LookupDirectoryEntry",
    "master.port.grpc": "/master_pb.Seaweed/VolumeList",
    "volume.port.grpc": "/volume_server_pb.VolumeServer/VolumeServerStatus",
    "s3.port.grpc": "/s3_pb.SeaweedS3/Configure",
    "admin.port.grpc": "/worker_pb.WorkerService/WorkerStream",
}


def test_grpc_ports_refuse_a_client_without_the_certificate(seaweedfs, teams):
    b, _ = teams["tenancy-b"]
    ca = seaweedfs.tls["ca"].read_bytes()
    for name, method in GRPC.items():
        target = f"127.0.0.1:{seaweedfs.ports[name]}"
        for channel in (grpc.insecure_channel(target),
                        grpc.secure_channel(target, grpc.ssl_channel_credentials(ca),
                                            options=[("grpc.ssl_target_name_override", "localhost")])):
            with pytest.raises(grpc.RpcError) as err:
                channel.unary_unary(method)(b"", timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, (name, err.value)
    # control: with the certificate the same filer call answers (the refusals above are the lock)
    key = next(iter(object_keys(seaweedfs, b.bucket)))
    found = lookup(seaweedfs, mtls_channel(seaweedfs, seaweedfs.ports["filer.port.grpc"]), f"/buckets/{b.bucket}/{key}")
    assert key.rsplit("/", 1)[1].encode() in found


def test_a_team_namespace_secret_holds_only_that_teams_key(seaweedfs, teams, kube_cluster):
    a, b = teams["tenancy-a"][0], teams["tenancy-b"][0]
    core = kube_cluster.core()
    namespaces = {a.name: "tenancy-ns-a", b.name: "tenancy-ns-b"}
    for ns in namespaces.values():
        core.create_namespace({"metadata": {"name": ns}})
    create_team_secrets(core, seaweedfs, namespaces, "s3-credentials")

    for team, other in ((a, b), (b, a)):
        secret = core.read_namespaced_secret("s3-credentials", namespaces[team.name])
        # what the kubelet gives the pods: data, and stringData (which the local API server keeps as sent)
        data = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()} | (secret.string_data or {})
        assert data["AWS_ACCESS_KEY_ID"] == team.access_key and data["AWS_SECRET_ACCESS_KEY"] == team.secret_key
        assert data["AWS_ENDPOINT_URL"] == seaweedfs.endpoint_url
        values = "\n".join(data.values())
        for foreign in (seaweedfs.access_key, seaweedfs.secret_key, other.access_key, other.secret_key):
            assert foreign not in values
        assert set(data) == {"AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ACCESS_KEY_ID",
                             "AWS_SECRET_ACCESS_KEY"}
