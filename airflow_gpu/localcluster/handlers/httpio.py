"""Request and response values of the ASGI app (plain, no framework)."""

from __future__ import annotations

import re
from urllib.parse import parse_qs

import msgspec
import yaml

from airflow_gpu.bounded import tree_problem
from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.handlers import protobuf
from airflow_gpu.localcluster.registry.store import decode, encode

JSON = [(b"content-type", b"application/json")]
# what the real API server accepts: 3 MiB a request (etcd's 1.5 MiB object limit, doubled for encoding);
# depth and expanded size bound YAML alias bombs and JSON nesting before anything walks the body
MAX_BODY_BYTES = 3 * 1024 * 1024
MAX_BODY_VALUES = 1_000_000
MAX_BODY_DEPTH = 100
TRUE = ("true", "1", "True")


class Yaml12Loader(yaml.SafeLoader):
    """YAML as the API server reads it (sigs.k8s.io/yaml): only true/false are booleans, so keys and
    values such as y, n, on, off, yes stay strings (PyYAML's YAML 1.1 would turn them into booleans)."""


Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                   list("tTfF"))


class Request:
    __slots__ = ("method", "path", "query", "headers", "body", "receive", "user")

    def __init__(self, scope, body: bytes, receive):
        self.method = scope["method"]
        self.path = scope["path"]
        self.query = {k: v[-1] for k, v in parse_qs(scope["query_string"].decode(), keep_blank_values=True).items()}
        self.headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.body = body
        self.receive = receive
        self.user = None  # who is asking (rbac.Access.authenticate), None on a server without Access

    def json(self):
        body = self._parse()
        if not self._json_within_bounds(body):
            problem = tree_problem(body, MAX_BODY_VALUES, MAX_BODY_DEPTH)
            if problem:
                raise errors.request_too_large(f"the request body expands to {problem}")
        return body

    def _json_within_bounds(self, body) -> bool:
        """Whether a JSON body is within the bounds without walking it: JSON has no aliases, so it holds
        fewer values than bytes and nests no deeper than its opening brackets (those inside strings only
        make this answer no more often). Saves the walk for nearly every request (a pod: ~20 brackets)."""
        raw = self.body  # what _parse decoded as JSON (also under a YAML content type)
        return (isinstance(body, (dict, list)) and "protobuf" not in self.headers.get("content-type", "")
                and raw.lstrip()[:1] in (b"{", b"[")
                and len(raw) <= MAX_BODY_VALUES and raw.count(b"{") + raw.count(b"[") <= MAX_BODY_DEPTH)

    def _parse(self):
        ctype = self.headers.get("content-type", "application/json").split(";")[0].strip()
        if "protobuf" in ctype:
            return protobuf.decode_body(self.body, "")
        if "cbor" in ctype:
            raise errors.unsupported_media_type(ctype)
        if not self.body.strip():
            raise errors.bad_request("the request body is empty; send a JSON object")
        try:
            if "yaml" in ctype:
                if self.body.lstrip()[:1] in (b"{", b"["):
                    return decode(self.body)  # kubectl sends apply patches as JSON
                return yaml.load(self.body, Loader=Yaml12Loader)
            return decode(self.body)
        except (msgspec.DecodeError, yaml.YAMLError, ValueError) as exc:
            raise errors.bad_request(f"couldn't get version/kind; json parse error: {str(exc)[:300]}") from None
        except RecursionError:
            raise errors.bad_request(f"the request body is nested deeper than {MAX_BODY_DEPTH} levels") from None


class Response:
    __slots__ = ("status", "body", "headers")

    def __init__(self, status: int, body: bytes, headers: list | None = None):
        self.status, self.body, self.headers = status, body, headers or JSON


def json_response(obj, status: int = 200, warnings: list[str] | None = None) -> Response:
    headers = list(JSON)
    for w in warnings or []:
        headers.append((b"warning", f'299 - "{w}"'.encode()))
    return Response(status, encode(obj), headers)
