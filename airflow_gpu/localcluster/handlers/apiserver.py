"""The HTTP side of the API server: a plain ASGI app (run by uvicorn) with a small router.

Kept below a framework on purpose: the hot paths (create, list, watch fan-out) are a few dict
operations plus one JSON encode, and stored objects are sent as their cached JSON bytes.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import AsyncIterator, Awaitable, Callable
from urllib.parse import unquote

from airflow_gpu.localcluster.handlers import discovery
from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.kubelet import podstream
from airflow_gpu.localcluster.admission import serviceaccounts
from airflow_gpu.localcluster.handlers.audit import AuditLog
from airflow_gpu.localcluster.handlers.audit import now as audit_now
from airflow_gpu.localcluster.errors import ApiError
from airflow_gpu.localcluster.handlers.httpio import MAX_BODY_BYTES, TRUE, Request, Response, json_response
from airflow_gpu.localcluster.registry.objects import ObjectAPI
from airflow_gpu.localcluster.registry.patch import apply_patch
from airflow_gpu.localcluster.kubelet.podstream import PodStreams
from airflow_gpu.localcluster.handlers.rbac import REVIEW_VERBS, UNAUTHENTICATED_PATHS, Access
from airflow_gpu.localcluster.registry.resources import Registry, ResourceType
from airflow_gpu.localcluster.registry.schema import decode_object
from airflow_gpu.localcluster.registry.selectors import fields_match, labels_match, parse_field_selector, parse_label_selector
from airflow_gpu.localcluster.registry.store import Store, decode, encode
from airflow_gpu.localcluster.handlers.streaming import stream_log, stream_watch
from airflow_gpu.localcluster.controllers.workloads import evict_pod

log = logging.getLogger(__name__)

LogSource = Callable[[str, str, str, dict], AsyncIterator[bytes]]  # (namespace, pod, container, options)
Control = Callable[[str, dict], Awaitable[dict]]  # (action, body) -> result


class APIServer:
    def __init__(self, store: Store, registry: Registry, objects: ObjectAPI, address: str, token: str | None = None,
                 log_source: LogSource | None = None, control: Control | None = None, bookmark_seconds: float = 5.0,
                 audit: AuditLog | None = None, streams: PodStreams | None = None, access: Access | None = None):
        self.store, self.registry, self.objects = store, registry, objects
        self.address, self.token = address, token
        self.log_source, self.control = log_source, control
        self.bookmark_seconds = bookmark_seconds
        self.openapi = discovery.OpenAPI(registry)
        self.watch_tasks: set[asyncio.Task] = set()
        self.audit = audit
        self.streams = streams
        self.access = access
        self.latency = 0.0  # fault: seconds added before every API request is served (POST /_localcluster/latency)

    def _authorize_stream(self, scope, headers: dict) -> None:
        """exec/attach/portforward arrive as a websocket GET; RBAC checks them as `create` on the
        subresource, as kube-apiserver does (AuthorizePodWebsocketUpgradeCreatePermission)."""
        if self.access is None:
            if self.token and headers.get("authorization") != f"Bearer {self.token}":
                raise errors.unauthorized()
            return
        user = self.access.authenticate(headers.get("authorization"), (scope.get("server") or (0, 0))[1])
        self.access.authorize(user, "POST", scope["path"], {})

    # --- ASGI -------------------------------------------------------------------------------
    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] == "websocket":  # pods/exec, attach, portforward
            if self.streams is not None:
                await self.streams.handle(scope, receive, send, self._authorize_stream)
            else:
                await receive()
                await podstream.deny(send, errors.bad_request("this server runs no kubelet"))
            return
        if scope["type"] != "http":
            return
        if self.latency and not scope["path"].startswith("/_localcluster/"):
            await asyncio.sleep(self.latency)  # a slow API server (the fault controls themselves stay prompt)
        body = b""
        if scope["method"] in ("POST", "PUT", "PATCH", "DELETE"):
            more = True
            chunks = []
            size = 0
            while more:
                message = await receive()
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
                more = message.get("more_body", False)
                if size > MAX_BODY_BYTES:
                    error = errors.request_too_large(f"limit is {MAX_BODY_BYTES}")
                    result = json_response(error.status(), error.code)
                    await send({"type": "http.response.start", "status": result.status, "headers": result.headers
                                + [(b"content-length", str(len(result.body)).encode()), (b"connection", b"close")]})
                    await send({"type": "http.response.body", "body": result.body})
                    return
            body = b"".join(chunks)
        received = audit_now() if self.audit else ""
        req = None
        try:
            req = Request(scope, body, receive)
            if req.path in UNAUTHENTICATED_PATHS:
                pass
            elif self.access is not None:
                req.user = self.access.authenticate(req.headers.get("authorization"), (scope.get("server") or (0, 0))[1])
                self.access.authorize(req.user, req.method, req.path, req.query)
            elif self.token and req.headers.get("authorization") != f"Bearer {self.token}":
                raise errors.unauthorized()
            result = await self.route(req, send)
            if scope["method"] != "GET":
                await self.store.durable()  # a write is answered only once it is in the log
        except ApiError as exc:
            result = json_response(exc.status(), exc.code)
        except Exception as exc:  # never let a bad request take the server down
            log.exception("internal error on %s %s", scope["method"], scope["path"])
            result = json_response(ApiError(500, "InternalError", f"Internal error occurred: {exc}").status(), 500)
        if result is not None:  # else streamed (watch, log), already sent
            await send({"type": "http.response.start", "status": result.status,
                        "headers": result.headers + [(b"content-length", str(len(result.body)).encode())]})
            await send({"type": "http.response.body", "body": result.body})
        if self.audit is not None:
            headers = req.headers if req is not None else {}
            self.audit.record(scope["method"], scope["path"], scope["query_string"].decode(),
                              req.query if req is not None else {}, headers.get("user-agent", ""),
                              result.status if result is not None else 200, received)

    # --- routing ----------------------------------------------------------------------------
    async def route(self, req: Request, send) -> Response | None:
        path = req.path.rstrip("/") or "/"
        parts = [unquote(p) for p in path.split("/")[1:]] if path != "/" else []
        if parts and parts[0] == "api":
            if len(parts) == 1:
                return json_response(discovery.api_versions(self.address))
            return await self.resource(req, send, "", parts[1], parts[2:])
        if parts and parts[0] == "apis":
            if len(parts) == 1:
                return json_response(discovery.api_group_list(self.registry))
            if len(parts) == 2:
                group = discovery.api_group(self.registry, parts[1])
                if group is None:
                    raise errors.no_such_path()
                return json_response(group)
            return await self.resource(req, send, parts[1], parts[2], parts[3:])
        if path == "/version":
            return json_response(discovery.VERSION_INFO)
        if path in ("/healthz", "/livez", "/readyz"):
            return Response(200, b"ok", [(b"content-type", b"text/plain")])
        if path == "/openapi/v2":
            protobuf = "protobuf" in req.headers.get("accept", "")
            # as kube-openapi: protobuf goes out as application/octet-stream (Go's mime parser rejects the "@")
            return Response(200, self.openapi.v2(protobuf), [(b"content-type", b"application/octet-stream"
                                                               if protobuf else b"application/json")])
        if path == "/openapi/v3":
            return json_response(self.openapi.index())
        if path.startswith("/openapi/v3/"):
            doc = self.openapi.document(path[len("/openapi/v3/"):])
            if doc is None:
                raise errors.no_such_path()
            return Response(200, doc)
        if path.startswith("/_localcluster/") and self.control is not None and req.method == "POST":
            body = req.json() if req.body.strip() else {}
            return json_response(await self.control(path[len("/_localcluster/"):], body))
        raise errors.no_such_path()

    async def resource(self, req: Request, send, group: str, version: str, rest: list[str]) -> Response | None:
        if not rest:
            doc = discovery.api_resource_list(self.registry, group, version)
            if doc is None:
                raise errors.no_such_path()
            return json_response(doc)
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3 and not (len(rest) == 3 and rest[2] in ("status", "finalize")):
            namespace, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise errors.no_such_path()
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else ""
        if not group and plural == "bindings" and namespace and name is None and req.method == "POST":
            body = req.json()
            return self.binding(namespace, (body.get("metadata") or {}).get("name", ""), body)
        rt = self.registry.lookup(group, version, plural)
        if rt is None or (namespace is not None and not rt.namespaced):
            raise errors.no_such_path()
        if sub and sub not in rt.subresources:
            raise errors.no_such_path()
        if rt.namespaced and name is not None and namespace is None:
            raise errors.no_such_path()
        ns = namespace if rt.namespaced else ""
        method = req.method
        if rt.verbs == REVIEW_VERBS:
            if method != "POST" or name is not None or self.access is None:
                raise errors.method_not_allowed(method)
            return json_response(self.access.review(rt.kind, req.json(), req.user), 201)
        if sub == "token" and method == "POST" and self.access is not None:
            return json_response(serviceaccounts.token_request(self.access.issuer, self.store, ns, name, req.json()), 201)
        if name is None:
            if method == "GET":
                if req.query.get("watch") in TRUE:
                    await self.watch(req, send, rt, version, namespace)
                    return None
                return self.list(req, rt, version, namespace)
            if method == "POST":
                return self.create(req, rt, version, ns)
            if method == "DELETE":
                return self.delete_collection(req, rt, namespace)
            raise errors.method_not_allowed(method)
        if sub == "log" and method == "GET":
            return await self.pod_log(req, send, ns, name)
        if sub == "binding" and method == "POST":
            return self.binding(ns, name, req.json())
        if sub == "eviction" and method == "POST":
            return self.eviction(ns, name, req.json(), req.query)
        if sub == "scale":
            return self.scale(req, rt, ns, name)
        if sub in podstream.SUBRESOURCES:  # served over WebSocket only (see podstream)
            protocols = podstream.PORTFORWARD_PROTOCOLS if sub == "portforward" else podstream.EXEC_PROTOCOLS
            raise errors.bad_request(f"Upgrade request required: pods/{sub} is served over WebSocket or SPDY/3.1 "
                                     f"({', '.join(protocols)})")
        if method == "GET":
            obj = self.objects.get(rt, ns, name)
            if "as=Table" in req.headers.get("accept", "") and not sub:
                return json_response(discovery.to_table(rt, version, [obj], obj["metadata"]["resourceVersion"],
                                                        req.query.get("includeObject", "Metadata")))
            return self.out(rt, version, obj)
        if method == "PUT":
            body, warnings = self.decode_body(req, rt, version)
            obj = self.objects.update(rt, body, ns, name, sub, dry_run=req.query.get("dryRun") == "All",
                                      manager=req.query.get("fieldManager"))
            return self.out(rt, version, obj, warnings=warnings)
        if method == "PATCH":
            return self.patch(req, rt, version, ns, name, sub)
        if method == "DELETE":
            return self.delete(req, rt, version, ns, name)
        raise errors.method_not_allowed(method)

    # --- verbs ------------------------------------------------------------------------------
    def out(self, rt: ResourceType, version: str, obj: dict, status: int = 200, warnings=None) -> Response:
        want = rt.api_version(version)
        if obj.get("apiVersion") != want:
            obj = {**obj, "apiVersion": want}
        return json_response(obj, status, warnings)

    def decode_body(self, req: Request, rt: ResourceType, version: str) -> tuple[dict, list[str]]:
        body = req.json()
        if not isinstance(body, dict):
            raise errors.bad_request(f"{rt.kind} in version \"{version}\" cannot be handled as a {rt.kind}: "
                                     "the body is not a JSON object")
        kind, api_version = body.get("kind"), body.get("apiVersion")
        if kind and kind != rt.kind:
            raise errors.bad_request(f'the kind "{kind}" of the request body does not match the kind "{rt.kind}" '
                                     f"of the resource {rt.plural}; send it to that kind's endpoint")
        if api_version and api_version != rt.api_version(version):
            if not (rt.crd and api_version.rpartition("/")[2] in rt.versions and api_version.startswith(rt.group + "/")):
                raise errors.bad_request(f'the API version in the data ({api_version}) does not match the expected '
                                         f'API version ({rt.api_version(version)})')
        validation = req.query.get("fieldValidation", "Warn")
        if validation not in ("Strict", "Warn", "Ignore"):
            raise errors.bad_request(f'fieldValidation must be one of "Ignore", "Warn" or "Strict", not "{validation}"')
        obj, warnings = decode_object(rt, version, body, validation)
        if rt.crd:
            obj["apiVersion"] = rt.api_version()
        return obj, warnings

    def create(self, req: Request, rt: ResourceType, version: str, ns: str) -> Response:
        body, warnings = self.decode_body(req, rt, version)
        obj = self.objects.create(rt, body, ns or None, dry_run=req.query.get("dryRun") == "All",
                                  manager=req.query.get("fieldManager"))
        return self.out(rt, version, obj, 201, warnings)

    def patch(self, req: Request, rt: ResourceType, version: str, ns: str, name: str, sub: str) -> Response:
        ctype = req.headers.get("content-type", "").split(";")[0].strip()
        body = req.json()
        warnings = []
        if isinstance(body, dict) and ctype != "application/json-patch+json":
            validation = req.query.get("fieldValidation", "Warn")
            probe = {"metadata": {}, **body}
            _, warnings = decode_object(rt, version, _strip_directives(probe), validation)
        obj, created = self.objects.patch(rt, ns, name, body, ctype, sub, dry_run=req.query.get("dryRun") == "All",
                                          manager=req.query.get("fieldManager"), force=req.query.get("force") in TRUE)
        return self.out(rt, version, obj, 201 if created else 200, warnings)

    def _delete_options(self, req: Request) -> dict:
        opts = {}
        if req.body.strip():
            opts = req.json()
            if not isinstance(opts, dict):
                raise errors.bad_request("DeleteOptions must be a JSON object")
        for key in ("gracePeriodSeconds", "propagationPolicy"):
            if key in req.query and opts.get(key) is None:
                opts[key] = _int_param(req.query, key) if key == "gracePeriodSeconds" else req.query[key]
        _check_grace(opts.get("gracePeriodSeconds"))
        policy = opts.get("propagationPolicy")
        if policy not in (None, "Orphan", "Background", "Foreground"):
            raise errors.bad_request(f'propagationPolicy must be Orphan, Background or Foreground, not "{policy}"')
        return opts

    def delete(self, req: Request, rt: ResourceType, version: str, ns: str, name: str) -> Response:
        opts = self._delete_options(req)
        obj, gone = self.objects.delete(rt, ns, name, opts.get("gracePeriodSeconds"), opts.get("propagationPolicy"),
                                        opts.get("preconditions"), dry_run=req.query.get("dryRun") == "All")
        if gone and not rt.crd:
            return json_response(errors.status_success(200, {"name": name, "group": rt.group, "kind": rt.plural,
                                                             "uid": obj["metadata"]["uid"]}))
        return self.out(rt, version, obj)  # 200 also when deletion is pending (graceful, finalizers)

    def delete_collection(self, req: Request, rt: ResourceType, namespace: str | None) -> Response:
        opts = self._delete_options(req)
        for obj in self._select(req, rt, namespace):
            meta = obj["metadata"]
            try:
                self.objects.delete(rt, meta.get("namespace", ""), meta["name"], opts.get("gracePeriodSeconds"),
                                    opts.get("propagationPolicy"))
            except ApiError as exc:
                if exc.code != 404:
                    raise
        return json_response(errors.status_success())

    def _select(self, req: Request, rt: ResourceType, namespace: str | None) -> list[dict]:
        lreqs = parse_label_selector(req.query.get("labelSelector"))
        freqs = parse_field_selector(req.query.get("fieldSelector"), rt.kind)
        out = []
        for entry in self.store.entries(rt.key, namespace):
            obj = entry.obj
            if lreqs and not labels_match(lreqs, obj["metadata"].get("labels")):
                continue
            if freqs and not fields_match(freqs, obj):
                continue
            out.append(obj)
        return out

    def list(self, req: Request, rt: ResourceType, version: str, namespace: str | None) -> Response:
        lreqs = parse_label_selector(req.query.get("labelSelector"))
        freqs = parse_field_selector(req.query.get("fieldSelector"), rt.kind)
        entries = self.store.entries(rt.key, namespace)
        if lreqs or freqs:
            entries = [e for e in entries if labels_match(lreqs, e.obj["metadata"].get("labels"))
                       and fields_match(freqs, e.obj)]
        entries.sort(key=lambda e: (e.obj["metadata"].get("namespace", ""), e.obj["metadata"]["name"]))
        cont = req.query.get("continue")
        if cont:
            try:
                after = tuple(decode(base64.urlsafe_b64decode(cont.encode())))
            except Exception:
                raise errors.bad_request("continue key is not valid: send the value from the previous list") from None
            entries = [e for e in entries if (e.obj["metadata"].get("namespace", ""), e.obj["metadata"]["name"]) > after]
        limit = _int_param(req.query, "limit", 0)
        next_token = None
        if limit and len(entries) > limit:
            entries = entries[:limit]
            last = entries[-1].obj["metadata"]
            next_token = base64.urlsafe_b64encode(encode([last.get("namespace", ""), last["name"]])).decode()
        rv = str(self.store.rv)
        if "as=Table" in req.headers.get("accept", ""):
            table = discovery.to_table(rt, version, [e.obj for e in entries], rv,
                                       req.query.get("includeObject", "Metadata"), next_token)
            return json_response(table)
        meta = {"resourceVersion": rv}
        if next_token:
            meta["continue"] = next_token
        api_version = rt.api_version(version)
        head = encode({"kind": rt.list_kind, "apiVersion": api_version, "metadata": meta})
        if rt.crd and version != rt.versions[0]:
            items = b",".join(encode({**e.obj, "apiVersion": api_version}) for e in entries)
        else:
            items = b",".join(e.raw for e in entries)
        return Response(200, head[:-1] + b',"items":[' + items + b"]}")

    # --- watch ------------------------------------------------------------------------------
    async def watch(self, req: Request, send, rt: ResourceType, version: str, namespace: str | None) -> None:
        await stream_watch(self.store, req, send, rt, version, namespace, self.bookmark_seconds, self.watch_tasks)

    # --- pod subresources -------------------------------------------------------------------
    def binding(self, ns: str, name: str, body) -> Response:
        if not isinstance(body, dict) or not isinstance(body.get("target"), dict) or not body["target"].get("name"):
            raise errors.invalid("Binding", name, [("target.name", "FieldValueRequired", "Required value")])
        uid = (body.get("metadata") or {}).get("uid")
        self.objects.bind(ns, name, body["target"]["name"], uid)
        return json_response(errors.status_success(201), 201)

    def eviction(self, ns: str, name: str, body, query: dict) -> Response:
        if not isinstance(body, dict):
            raise errors.bad_request("an Eviction must be a JSON object")
        opts = body.get("deleteOptions") or {}
        if not isinstance(opts, dict):
            raise errors.bad_request("Eviction deleteOptions must be a JSON object")
        _check_grace(opts.get("gracePeriodSeconds"))
        if (body.get("metadata") or {}).get("name", name) != name:
            raise errors.bad_request("name in URL does not match name in Eviction object")
        pod = self.store.get("/pods", ns, name)
        if pod is None:
            raise errors.not_found("pods", name)
        evict_pod(self.objects, pod, opts.get("gracePeriodSeconds"),
                  dry_run=query.get("dryRun") == "All" or opts.get("dryRun") == ["All"])
        return json_response(errors.status_success(201), 201)

    def scale(self, req: Request, rt: ResourceType, ns: str, name: str) -> Response:
        """The scale subresource (autoscaling/v1 Scale) of Deployments and ReplicaSets: kubectl scale."""
        obj = self.objects.get(rt, ns, name)
        scale = scale_of(obj)
        if req.method == "GET":
            return json_response(scale)
        if req.method == "PUT":
            wanted = req.json()
        elif req.method == "PATCH":
            ctype = req.headers.get("content-type", "").split(";")[0].strip()
            wanted = apply_patch(scale, req.json(), ctype, strategic_ok=True)
        else:
            raise errors.method_not_allowed(req.method)
        replicas = ((wanted or {}).get("spec") or {}).get("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise errors.invalid("Scale", name, [("spec.replicas", "FieldValueInvalid",
                                                  f"Invalid value: {replicas}: must be greater than or equal to 0")],
                                 "autoscaling")
        expect = ((wanted or {}).get("metadata") or {}).get("resourceVersion")
        if expect and expect != obj["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.plural, name, rt.group)
        new = {**obj, "spec": {**obj["spec"], "replicas": replicas}, "metadata": dict(obj["metadata"])}
        updated = self.objects.update(rt, new, ns, name, dry_run=req.query.get("dryRun") == "All",
                                      manager=req.query.get("fieldManager"))
        return json_response(scale_of(updated))

    async def pod_log(self, req: Request, send, ns: str, name: str) -> Response | None:
        pod = self.store.get("/pods", ns, name)
        if pod is None:
            raise errors.not_found("pods", name)
        containers = [c["name"] for c in pod["spec"].get("containers") or []]
        container = req.query.get("container") or ""
        if not container:
            if len(containers) != 1:
                raise errors.bad_request(f"a container name must be specified for pod {name}, choose one of: {containers}")
            container = containers[0]
        elif container not in containers + [c["name"] for c in pod["spec"].get("initContainers") or []]:
            raise errors.bad_request(f"container {container} is not valid for pod {name}")
        if self.log_source is None:
            raise errors.bad_request("this server runs no kubelet")
        stream = self.log_source(ns, name, container, req.query)  # raises ApiError if not started
        await stream_log(stream, send, req.receive)
        return None


def scale_of(obj: dict) -> dict:
    meta = obj["metadata"]
    selector = (obj.get("spec") or {}).get("selector") or {}
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        op, values = expr.get("operator"), ",".join(expr.get("values") or [])
        parts.append({"In": f"{expr['key']} in ({values})", "NotIn": f"{expr['key']} notin ({values})",
                      "Exists": expr["key"], "DoesNotExist": f"!{expr['key']}"}.get(op, expr["key"]))
    return {"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                         if k in meta},
            "spec": {"replicas": (obj.get("spec") or {}).get("replicas", 1)},
            "status": {"replicas": (obj.get("status") or {}).get("replicas", 0), "selector": ",".join(parts)}}


def _int_param(query: dict, key: str, default: int | None = None) -> int | None:
    """A non-negative integer query parameter; 400 naming it otherwise (never a 500)."""
    raw = query.get(key)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise errors.bad_request(f"{key}={raw[:40]!r}: must be a non-negative integer") from None
    if value < 0:
        raise errors.bad_request(f"{key}={value}: must be a non-negative integer")
    return value


def _check_grace(value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise errors.bad_request(f"gracePeriodSeconds={str(value)[:40]}: must be a non-negative integer")


def _strip_directives(obj):
    if isinstance(obj, dict):
        return {k: _strip_directives(v) for k, v in obj.items() if not k.startswith("$")}
    if isinstance(obj, list):
        return [_strip_directives(v) for v in obj if not (isinstance(v, dict) and "$patch" in v and len(v) <= 2)]
    return obj
