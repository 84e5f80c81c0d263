"""Configuration errors that name the file, the field path (teams[2].quota.a100-80gb) and what is allowed."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from inspect import isclass

from pydantic import BaseModel

from airflow_gpu.config.model import DNS_LABEL, LABEL_VALUE, MIG_PROFILE

_PATTERN_HINTS = {
    DNS_LABEL: "a lowercase DNS label: a-z, 0-9 and '-', starting and ending with a letter or digit",
    MIG_PROFILE: "a MIG profile name like 1g.10gb, 3g.40gb or 7g.80gb (<compute slices 1-7>g.<memory>gb)",
    LABEL_VALUE: "a Kubernetes label value like NVIDIA-A100-SXM4-80GB: letters, digits, '-', '_', '.', "
                 "starting and ending with a letter or digit, at most 63 characters",
}

_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
           "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}
_EXPECTED = {"dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
             "list_type": "a list", "bool_type": "true or false"}


@dataclass(frozen=True)
class ConfigIssue:
    path: str  # e.g. "teams[2].quota.a100-80gb"; "" for the file as a whole
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(ValueError):
    """The configuration is invalid. Every issue is reported, not only the first."""

    def __init__(self, source: str, issues: list[ConfigIssue]):
        self.source = source
        self.issues = issues
        super().__init__(str(self))

    def __str__(self) -> str:
        head = f"{self.source}: invalid quota configuration ({len(self.issues)} problem{'s' * (len(self.issues) != 1)})"
        return "\n".join([head] + [f"  {self.source}: {issue}" for issue in self.issues])


def format_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def issue_from_pydantic(error: dict, root: type[BaseModel]) -> ConfigIssue:
    """One pydantic error dict -> a ConfigIssue with a message that says what is allowed."""
    loc = tuple(error["loc"])
    kind = error["type"]
    got = error.get("input")
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        allowed = _allowed_keys(root, loc[:-1])
        message = f"unknown key {loc[-1]!r}" + (f"; allowed keys: {', '.join(allowed)}" if allowed else "")
    elif kind == "missing":
        message = "required field is missing"
    elif kind in ("int_type", "int_from_float", "int_parsing"):
        message = f"must be a whole number (got {got!r})"
    elif kind in _BOUNDS:
        op, key = _BOUNDS[kind]
        message = f"must be {op} {ctx.get(key)} (got {got!r})"
    elif kind == "string_pattern_mismatch":
        hint = _PATTERN_HINTS.get(ctx.get("pattern"), f"matching {ctx.get('pattern')}")
        message = f"must be {hint} (got {got!r})"
    elif kind in _EXPECTED:
        message = f"must be {_EXPECTED[kind]} (got {type(got).__name__}: {got!r})"
    else:
        message = f"{error['msg']} (got {got!r})"
    return ConfigIssue(format_path(loc), message)


def _allowed_keys(root: type[BaseModel], loc: tuple) -> list[str]:
    tp: typing.Any = root
    for part in loc:
        tp = _descend(tp, part)
        if tp is None:
            return []
    tp = _unwrap(tp)
    if isclass(tp) and issubclass(tp, BaseModel):
        return list(tp.model_fields)
    return []


def _descend(tp, key):
    tp = _unwrap(tp)
    if isclass(tp) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(key) if isinstance(key, str) else None
        return field.annotation if field else None
    origin = typing.get_origin(tp)
    if origin is list:
        return typing.get_args(tp)[0]
    if origin is dict:
        return typing.get_args(tp)[1]
    return None


def _unwrap(tp):
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            non_none = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = non_none[0]
        else:
            return tp
