"""Service accounts as a real control plane has them: a `default` ServiceAccount and the
`kube-root-ca.crt` ConfigMap in every namespace (created with the namespace, as the serviceaccount and
root-ca-cert-publisher controllers do), the ServiceAccount admission plugin (a pod naming a missing
account is refused; the kube-api-access projected volume is added), and bound service-account tokens:
ES256 JWTs with the claims kube-apiserver puts in them, issued by the TokenRequest API
(`serviceaccounts/<name>/token`, `kubectl create token`) and by the kubelet for projected volumes, and
accepted only while their ServiceAccount (and the pod they are bound to) still exists with the same uid.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.registry.shared import freeze

ISSUER = "https://kubernetes.default.svc.cluster.local"
API_AUDIENCES = (ISSUER,)  # kube-apiserver's --api-audiences default to the issuer
SA_KEY, POD_KEY, CM_KEY = "/serviceaccounts", "/pods", "/configmaps"
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
TOKEN_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
INJECTED_TOKEN_SECONDS = 3607
MIN_TOKEN_SECONDS = 600  # TokenRequest's lower bound
DEFAULT_TOKEN_SECONDS = 3600
NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_CACHE_LIMIT = 4096


@dataclass(frozen=True)
class User:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    service_account: tuple[str, str] | None = None  # (namespace, name)

    @property
    def unrestricted(self) -> bool:
        return "system:masters" in self.groups

    def info(self) -> dict:
        out = {"username": self.name, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra}
        return out


ADMIN = User("kubernetes-admin", groups=("system:masters", "system:authenticated"))


@dataclass
class _Verified:
    claims: dict
    audiences: tuple[str, ...] = field(default=())


class TokenIssuer:
    """Signs and verifies bound service-account tokens with a key kept in the state dir (so tokens stay
    valid across cluster restarts, as they do across kube-apiserver restarts)."""

    def __init__(self, key_dir: Path, store):
        self.store = store
        key_dir.mkdir(parents=True, exist_ok=True)
        path = key_dir / "sa-signing-key.pem"
        if not path.exists():
            key = ec.generate_private_key(ec.SECP256R1())
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
            tmp.chmod(0o600)
            tmp.replace(path)
        self._key = serialization.load_pem_private_key(path.read_bytes(), None)
        self._public = self._key.public_key()
        self._verified: dict[str, _Verified] = {}  # token -> verified claims (signature checked once)
        self._lock = threading.Lock()

    def issue(self, namespace: str, account: str, audiences: list[str] | None, seconds: int,
              pod: dict | None = None) -> tuple[str, dt.datetime]:
        sa = self.store.get(SA_KEY, namespace, account)
        if sa is None:
            raise errors.not_found("serviceaccounts", account)
        now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
        expires = now + dt.timedelta(seconds=seconds)
        k8s = {"namespace": namespace, "serviceaccount": {"name": account, "uid": sa["metadata"]["uid"]}}
        if pod is not None:
            k8s["pod"] = {"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
            if pod["spec"].get("nodeName"):
                k8s["node"] = {"name": pod["spec"]["nodeName"]}
        claims = {"iss": ISSUER, "sub": f"system:serviceaccount:{namespace}:{account}",
                  "aud": list(audiences or API_AUDIENCES), "iat": now, "nbf": now, "exp": expires,
                  "jti": str(uuid.uuid4()), "kubernetes.io": k8s}
        return jwt.encode(claims, self._key, algorithm="ES256", headers={"kid": "local"}), expires

    def issue_for_pod(self, pod: dict, audience: str | None, seconds: int) -> str:
        meta = pod["metadata"]
        token, _ = self.issue(meta["namespace"], pod["spec"].get("serviceAccountName") or "default",
                              [audience] if audience else None, seconds, pod)
        return token

    def verify(self, token: str, audiences: tuple[str, ...] = API_AUDIENCES) -> tuple[User, list[str]] | None:
        """The token's user if it is valid now for one of `audiences`, else None."""
        if token.count(".") != 2:
            return None
        with self._lock:
            verified = self._verified.get(token)
        if verified is None:
            try:
                claims = jwt.decode(token, self._public, algorithms=["ES256"], issuer=ISSUER,
                                    options={"verify_aud": False, "require": ["exp", "sub", "aud"]})
            except jwt.PyJWTError:
                return None
            aud = claims["aud"]
            verified = _Verified(claims, tuple([aud] if isinstance(aud, str) else aud))
            with self._lock:
                if len(self._verified) > _CACHE_LIMIT:
                    self._verified.clear()
                self._verified[token] = verified
        claims = verified.claims
        if claims["exp"] < dt.datetime.now(dt.timezone.utc).timestamp():
            return None
        matched = [a for a in verified.audiences if a in audiences]
        if not matched:
            return None
        k8s = claims.get("kubernetes.io") or {}
        ns, account = k8s.get("namespace", ""), (k8s.get("serviceaccount") or {})
        sa = self.store.get(SA_KEY, ns, account.get("name", ""))
        if sa is None or sa["metadata"]["uid"] != account.get("uid") or sa["metadata"].get("deletionTimestamp"):
            return None
        extra = []
        bound = k8s.get("pod")
        if bound:
            pod = self.store.get(POD_KEY, ns, bound.get("name", ""))
            if pod is None or pod["metadata"]["uid"] != bound.get("uid") or pod["metadata"].get("deletionTimestamp"):
                return None
            extra = [("authentication.kubernetes.io/pod-name", (bound["name"],)),
                     ("authentication.kubernetes.io/pod-uid", (bound["uid"],))]
            if k8s.get("node"):
                extra.append(("authentication.kubernetes.io/node-name", (k8s["node"]["name"],)))
        extra.append(("authentication.kubernetes.io/credential-id", (f"JTI={claims.get('jti', '')}",)))
        user = User(claims["sub"], account["uid"], ("system:serviceaccounts", f"system:serviceaccounts:{ns}",
                                                    "system:authenticated"), tuple(extra), (ns, account["name"]))
        return user, matched


def token_request(issuer: TokenIssuer, store, namespace: str, account: str, body) -> dict:
    """POST serviceaccounts/<name>/token: an authentication.k8s.io/v1 TokenRequest, answered."""
    if not isinstance(body, dict):
        raise errors.bad_request("a TokenRequest must be a JSON object")
    spec = body.get("spec") or {}
    seconds = spec.get("expirationSeconds") or DEFAULT_TOKEN_SECONDS
    if not isinstance(seconds, int) or seconds < MIN_TOKEN_SECONDS or seconds > 2 ** 32:
        raise errors.invalid("TokenRequest", account, [(
            "spec.expirationSeconds", "FieldValueInvalid",
            f"Invalid value: {seconds}: may not specify a duration less than 10 minutes")], "authentication.k8s.io")
    pod = None
    ref = spec.get("boundObjectRef")
    if ref:
        if ref.get("kind") != "Pod":
            raise errors.bad_request(f'boundObjectRef.kind "{ref.get("kind")}": the local cluster binds tokens to Pods only')
        pod = store.get(POD_KEY, namespace, ref.get("name", ""))
        if pod is None or (ref.get("uid") and ref["uid"] != pod["metadata"]["uid"]):
            raise errors.not_found("pods", ref.get("name", ""))
        if (pod["spec"].get("serviceAccountName") or "default") != account:
            raise errors.bad_request(f'pod "{pod["metadata"]["name"]}" runs as another service account, not "{account}"')
    token, expires = issuer.issue(namespace, account, spec.get("audiences"), seconds, pod)
    return {"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": account, "namespace": namespace, "creationTimestamp": None},
            "spec": {"audiences": list(spec.get("audiences") or API_AUDIENCES), "expirationSeconds": seconds,
                     "boundObjectRef": ref},
            "status": {"token": token, "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}}


# --- namespace contents and pod admission --------------------------------------------------------
def namespace_created(objects, namespace: str, ca_pem: str | None) -> None:
    """What the serviceaccount and root-ca-cert-publisher controllers create in a new namespace."""
    if objects.store.get(SA_KEY, namespace, "default") is None:
        objects.create(objects.registry.by_key(SA_KEY), {"metadata": {"name": "default"}}, namespace, admit=False)
    if ca_pem is not None and objects.store.get(CM_KEY, namespace, ROOT_CA_CONFIGMAP) is None:
        objects.create(objects.registry.by_key(CM_KEY), {
            "metadata": {"name": ROOT_CA_CONFIGMAP, "annotations": {
                "kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver "
                                             "when using internal endpoints such as the internal service IP or "
                                             "kubernetes.default.svc. No other usage is guaranteed across distributions "
                                             "of Kubernetes clusters."}},
            "data": {"ca.crt": ca_pem}}, namespace, admit=False)


INJECTED_PROJECTED = freeze({"defaultMode": 0o644, "sources": [
    {"serviceAccountToken": {"expirationSeconds": INJECTED_TOKEN_SECONDS, "path": "token"}},
    {"configMap": {"name": ROOT_CA_CONFIGMAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
    {"downwardAPI": {"items": [{"path": "namespace",
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
]})


def admit_pod(store, pod: dict) -> None:
    """The ServiceAccount admission plugin."""
    spec, meta = pod["spec"], pod["metadata"]
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    spec["serviceAccountName"] = spec["serviceAccount"] = account
    sa = store.get(SA_KEY, meta["namespace"], account)
    if sa is None:
        raise errors.forbidden("pods", meta.get("name", ""), f"error looking up service account "
                               f"{meta['namespace']}/{account}: serviceaccount \"{account}\" not found")
    automount = spec.get("automountServiceAccountToken")
    if automount is None:
        automount = sa.get("automountServiceAccountToken")
    if automount is False:
        return
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    if any(m.get("mountPath") == TOKEN_MOUNT_PATH for c in containers for m in c.get("volumeMounts") or []):
        return  # the pod mounts its own token there
    volume = "kube-api-access-" + "".join(random.choices(NAME_CHARS, k=5))
    spec.setdefault("volumes", []).append({"name": volume, "projected": INJECTED_PROJECTED})
    for c in containers:
        c.setdefault("volumeMounts", []).append({"name": volume, "mountPath": TOKEN_MOUNT_PATH, "readOnly": True})

