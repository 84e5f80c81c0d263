"""Who is asking and may they: authentication (admin token, service-account tokens), RBAC authorization
(Role/ClusterRole/RoleBinding/ClusterRoleBinding, as kube-apiserver's RBAC authorizer evaluates them), and
the review APIs kubectl uses (`auth can-i`: SelfSubjectAccessReview, `auth whoami`: SelfSubjectReview),
plus TokenReview and SubjectAccessReview.

The admin (the cluster's token, or anyone on the plain-http port of a cluster started without a token:
the one local user) is in system:masters and is never checked. Service-account tokens are always checked:
a pod gets what its bindings grant, and a forbidden call gets the 403 a real cluster sends. The bootstrap
roles that every cluster has for authenticated users (discovery, health, self reviews) and cluster-admin
are created at start as objects, so `kubectl get clusterroles` shows them as on a real cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.admission.serviceaccounts import ADMIN, API_AUDIENCES, TokenIssuer, User

CR_KEY, CRB_KEY = "rbac.authorization.k8s.io/clusterroles", "rbac.authorization.k8s.io/clusterrolebindings"
ROLE_KEY, RB_KEY = "rbac.authorization.k8s.io/roles", "rbac.authorization.k8s.io/rolebindings"
REVIEW_VERBS = ("create",)
UNAUTHENTICATED_PATHS = ("/healthz", "/livez", "/readyz")
BOOTSTRAP_ROLES = {
    "cluster-admin": ([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                       {"nonResourceURLs": ["*"], "verbs": ["*"]}], "system:masters"),
    "system:discovery": ([{"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez",
                                               "/openapi", "/openapi/*", "/readyz", "/version", "/version/"],
                           "verbs": ["get"]}], "system:authenticated"),
    "system:basic-user": ([{"apiGroups": ["authorization.k8s.io"],
                            "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]},
                           {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"],
                            "verbs": ["create"]}], "system:authenticated"),
    "system:public-info-viewer": ([{"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"],
                                    "verbs": ["get"]}], "system:unauthenticated"),
}


@dataclass(frozen=True)
class Attributes:
    verb: str
    path: str
    resource_request: bool = False
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    def describe(self) -> str:
        """The phrase of kube-apiserver's Forbidden message."""
        if not self.resource_request:
            return f'cannot {self.verb} path "{self.path}"'
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        where = f' in the namespace "{self.namespace}"' if self.namespace else " at the cluster scope"
        return f'cannot {self.verb} resource "{what}" in API group "{self.group}"{where}'


def request_attributes(method: str, path: str, query: dict) -> Attributes:
    """The RBAC attributes of an HTTP request, as kube-apiserver's RequestInfoFactory derives them."""
    parts = [unquote(p) for p in path.strip("/").split("/")] if path.strip("/") else []
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return Attributes(method.lower() if method != "HEAD" else "get", path)
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3 and not (len(rest) == 3 and rest[2] in ("status", "finalize")):
        namespace, rest = rest[1], rest[2:]
    elif rest[0] == "namespaces" and len(rest) >= 2:
        namespace = rest[1]  # a namespace object is in its own namespace for RBAC
    resource, name = rest[0], rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if method in ("GET", "HEAD"):
        verb = "get" if name else ("watch" if query.get("watch") in ("true", "1", "True") else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete" if name else "deletecollection"}.get(method, method.lower())
    return Attributes(verb, path, True, group, resource, sub, namespace, name)


def _rule_allows(rule: dict, attrs: Attributes) -> bool:
    verbs = rule.get("verbs") or []
    if "*" not in verbs and attrs.verb not in verbs:
        return False
    if not attrs.resource_request:
        return any(u == "*" or u == attrs.path or (u.endswith("*") and attrs.path.startswith(u[:-1]))
                   for u in rule.get("nonResourceURLs") or [])
    groups = rule.get("apiGroups")
    if groups is None or ("*" not in groups and attrs.group not in groups):
        return False
    resources = rule.get("resources") or []
    if attrs.subresource:
        wanted = (f"{attrs.resource}/{attrs.subresource}", f"*/{attrs.subresource}", f"{attrs.resource}/*", "*")
    else:
        wanted = (attrs.resource, "*")
    if not any(r in resources for r in wanted):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


def _subject_matches(subject: dict, user: User, binding_ns: str) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        return user.service_account == (subject.get("namespace") or binding_ns, subject.get("name"))
    if kind == "User":
        return subject.get("name") == user.name
    if kind == "Group":
        return subject.get("name") in user.groups
    return False


class Access:
    """Authentication, authorization and the review APIs of one cluster."""

    def __init__(self, store, issuer: TokenIssuer, admin_token: str | None, anonymous_admin_ports: set[int]):
        self.store, self.issuer = store, issuer
        self.admin_token = admin_token
        self.anonymous_admin_ports = anonymous_admin_ports  # plain-http port of a cluster without a token

    # --- authentication ------------------------------------------------------------------------
    def authenticate(self, authorization: str | None, port: int | None) -> User:
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():  # the Python client sends "bearer <token>"
            token = token.strip()
            if self.admin_token and token == self.admin_token:
                return ADMIN
            verified = self.issuer.verify(token)
            if verified is not None:
                return verified[0]
            raise errors.unauthorized()
        if port in self.anonymous_admin_ports:
            return ADMIN
        raise errors.unauthorized()

    # --- authorization -------------------------------------------------------------------------
    def allowed(self, user: User, attrs: Attributes) -> bool:
        if user.unrestricted:
            return True
        for binding in self.store.values(CRB_KEY):
            if self._binding_allows(binding, user, attrs, ""):
                return True
        if attrs.namespace:
            for binding in self.store.values(RB_KEY, attrs.namespace):
                if self._binding_allows(binding, user, attrs, attrs.namespace):
                    return True
        return False

    def _binding_allows(self, binding: dict, user: User, attrs: Attributes, namespace: str) -> bool:
        if not any(_subject_matches(s, user, namespace) for s in binding.get("subjects") or []):
            return False
        ref = binding.get("roleRef") or {}
        if ref.get("kind") == "ClusterRole":
            role = self.store.get(CR_KEY, "", ref.get("name", ""))
        elif ref.get("kind") == "Role" and namespace:
            role = self.store.get(ROLE_KEY, namespace, ref.get("name", ""))
        else:
            role = None
        return role is not None and any(_rule_allows(rule, attrs) for rule in role.get("rules") or [])

    def authorize(self, user: User, method: str, path: str, query: dict) -> None:
        if user.unrestricted:
            return
        attrs = request_attributes(method, path, query)
        if not self.allowed(user, attrs):
            if not attrs.resource_request:
                raise errors.ApiError(403, "Forbidden", f'forbidden: User "{user.name}" {attrs.describe()}', {})
            what = attrs.resource + (f"/{attrs.subresource}" if attrs.subresource else "")
            head = f"{what}.{attrs.group}" if attrs.group else what
            if attrs.name:
                head += f' "{attrs.name}"'
            raise errors.ApiError(403, "Forbidden", f'{head} is forbidden: User "{user.name}" {attrs.describe()}',
                                  {"name": attrs.name, "group": attrs.group, "kind": attrs.resource})

    # --- review APIs ---------------------------------------------------------------------------
    def review(self, kind: str, body, user: User) -> dict:
        if not isinstance(body, dict):
            raise errors.bad_request(f"a {kind} must be a JSON object")
        spec = body.get("spec") or {}
        out = {"kind": kind, "apiVersion": body.get("apiVersion") or "", "metadata": {"creationTimestamp": None},
               "spec": spec}
        if kind == "SelfSubjectReview":
            out["status"] = {"userInfo": user.info()}
        elif kind == "TokenReview":
            verified = self.issuer.verify(spec.get("token") or "", tuple(spec.get("audiences") or API_AUDIENCES))
            out["status"] = ({"authenticated": True, "user": verified[0].info(), "audiences": verified[1]}
                             if verified else {"authenticated": False, "error": "invalid bearer token"})
        elif kind in ("SelfSubjectAccessReview", "SubjectAccessReview"):
            subject = user if kind == "SelfSubjectAccessReview" else _subject_of(spec)
            attrs = _review_attributes(kind, spec)
            allowed = self.allowed(subject, attrs)
            out["status"] = {"allowed": allowed}  # a denial has no reason: RBAC has "no opinion", as kube-apiserver
            if allowed and not subject.unrestricted:
                out["status"]["reason"] = "RBAC: allowed by a binding"
        else:
            raise errors.no_such_path()
        return out

    def bootstrap(self, objects) -> None:
        """The default ClusterRoles and ClusterRoleBindings every cluster starts with."""
        for name, (rules, group) in BOOTSTRAP_ROLES.items():
            if self.store.get(CR_KEY, "", name) is None:
                objects.create(objects.registry.by_key(CR_KEY), {"metadata": {"name": name}, "rules": rules},
                               admit=False)
            if self.store.get(CRB_KEY, "", name) is None:
                objects.create(objects.registry.by_key(CRB_KEY), {
                    "metadata": {"name": name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]},
                    admit=False)


def _review_attributes(kind: str, spec: dict) -> Attributes:
    res, non = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if non:
        return Attributes(non.get("verb", ""), non.get("path", ""))
    if not res:
        raise errors.invalid(kind, "", [("spec.resourceAttributes", "FieldValueRequired",
                                         "Required value: exactly one of nonResourceAttributes or resourceAttributes "
                                         "must be specified")], "authorization.k8s.io")
    return Attributes(res.get("verb", ""), "", True, res.get("group", ""), res.get("resource", ""),
                      res.get("subresource", ""), res.get("namespace", ""), res.get("name", ""))


def _subject_of(spec: dict) -> User:
    name = spec.get("user") or ""
    account = None
    if name.startswith("system:serviceaccount:") and name.count(":") == 3:
        _, _, ns, sa = name.split(":")
        account = (ns, sa)
    return User(name, spec.get("uid") or "", tuple(spec.get("groups") or ()), (), account)
