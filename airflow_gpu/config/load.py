"""Read a quota configuration file: YAML -> structural validation (pydantic) -> cross-reference checks."""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path

import yaml
from pydantic import ValidationError

from airflow_gpu import constants
from airflow_gpu.bounded import tree_problem
from airflow_gpu.config.errors import ConfigError, ConfigIssue, issue_from_pydantic
from airflow_gpu.config.model import SLOTS_PER_GPU, QuotaConfig, format_gpus


MAX_FILE_BYTES = 1024 * 1024  # a quota file for thousands of teams is ~100 KB
MAX_VALUES = 200_000  # after YAML aliases are expanded: bounds time and memory of validation
MAX_DEPTH = 20  # the schema is 5 levels deep


def load_config(path: str | Path) -> QuotaConfig:
    """Load and validate a quota configuration file. Raises ConfigError naming every bad field.
    Bounded: at most MAX_FILE_BYTES of UTF-8 text that expands (aliases) to at most MAX_VALUES values."""
    source = str(path)
    fail = lambda message: ConfigError(source, [ConfigIssue("", message)])  # noqa: E731
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise fail(f"cannot read the file: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise fail(f"the file is larger than {MAX_FILE_BYTES // 1024} KB; a quota configuration is far smaller")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail(f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save the file as UTF-8") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise fail(f"not valid YAML: {_yaml_problem(exc)}") from None
    except ValueError as exc:  # e.g. an integer of thousands of digits
        raise fail(f"not valid YAML: {str(exc)[:200]}") from None
    except RecursionError:
        raise fail("not valid YAML: nested too deeply") from None
    problem = tree_problem(data, MAX_VALUES, MAX_DEPTH)
    if problem:
        raise fail(f"the configuration is too large: it expands to {problem}; write the values out")
    return parse_config(data, source=source)


def parse_config(data: object, source: str = "<config>") -> QuotaConfig:
    """Validate already-parsed data (a dict as from YAML or JSON)."""
    if not isinstance(data, dict):
        raise ConfigError(
            source,
            [ConfigIssue("", f"the top level must be a mapping with keys products, tiers, teams, capacity "
                             f"(got {type(data).__name__})")],
        )
    try:
        config = QuotaConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, [issue_from_pydantic(e, QuotaConfig) for e in exc.errors()]) from None
    issues = check_references(config)
    if issues:
        raise ConfigError(source, issues)
    return config


def check_references(cfg: QuotaConfig) -> list[ConfigIssue]:
    """Checks that span fields: duplicates, unknown products/profiles/tiers, limits, capacity."""
    issues: list[ConfigIssue] = []
    add = lambda path, message: issues.append(ConfigIssue(path, message))  # noqa: E731

    products = {}
    node_labels: dict[str, int] = {}
    for i, product in enumerate(cfg.products):
        if product.node_label is not None:
            if product.node_label in node_labels:
                add(f"products[{i}].node_label", f"node_label {product.node_label!r} is already the label of "
                    f"products[{node_labels[product.node_label]}]; each product needs its own node label")
            node_labels.setdefault(product.node_label, i)
        if product.name in products:
            add(f"products[{i}].name", f"duplicate product {product.name!r} (also products[{products[product.name]}])")
        products.setdefault(product.name, i)
        seen: dict[str, int] = {}
        for j, profile in enumerate(product.mig_profiles):
            path = f"products[{i}].mig_profiles[{j}]"
            if profile.name in seen:
                add(f"{path}.name", f"duplicate MIG profile {profile.name!r} (also mig_profiles[{seen[profile.name]}])")
            seen.setdefault(profile.name, j)
            if profile.memory_gb > product.memory_gb:
                add(f"{path}.memory_gb",
                    f"{profile.memory_gb:g} GB exceeds the product's memory ({product.memory_gb:g} GB)")
    product_list = ", ".join(products)

    tiers: dict[str, int] = {}
    for i, tier in enumerate(cfg.tiers):
        if tier.name in tiers:
            add(f"tiers[{i}].name", f"duplicate tier {tier.name!r} (also tiers[{tiers[tier.name]}])")
        tiers.setdefault(tier.name, i)
    missing = [t for t in constants.TIERS if t not in tiers]
    if missing:
        add("tiers", f"missing tier(s) {', '.join(missing)}; every tier must be defined: {', '.join(constants.TIERS)}")
    for tier in cfg.scheduling.estimate_error_seconds:
        if tier not in tiers:
            add(f"scheduling.estimate_error_seconds.{tier}", f"unknown tier {tier!r}; defined tiers: {', '.join(tiers)}")

    def known_product(path: str, name: str) -> bool:
        if name not in products:
            add(path, f"unknown GPU product {name!r}; defined products: {product_list}")
            return False
        return True

    names: dict[str, int] = {}
    namespaces: dict[str, int] = {}
    guaranteed: dict[str, list[tuple[str, int]]] = defaultdict(list)  # product -> [(team, slots)]
    for i, team in enumerate(cfg.teams):
        at = f"teams[{i}]"
        if team.name in names:
            add(f"{at}.name", f"duplicate team name {team.name!r} (also teams[{names[team.name]}])")
        names.setdefault(team.name, i)
        if team.namespace in namespaces:
            add(f"{at}.namespace", f"namespace {team.namespace!r} is already used by teams[{namespaces[team.namespace]}]")
        namespaces.setdefault(team.namespace, i)
        issues_before = len(issues)
        for field in ("quota", "borrowing_limit", "lending_limit"):
            for name in getattr(team, field):
                known_product(f"{at}.{field}.{name}", name)
        for name, profiles in team.mig_quota.items():
            if not known_product(f"{at}.mig_quota.{name}", name):
                continue
            product = cfg.products[products[name]]
            offered = [p.name for p in product.mig_profiles]
            for profile in profiles:
                if profile not in offered:
                    add(f"{at}.mig_quota.{name}.{profile}",
                        f"product {name!r} has no MIG profile {profile!r}; its profiles: {', '.join(offered) or 'none'}")
        for name, lend in team.lending_limit.items():
            if lend > team.quota_gpus(name):
                add(f"{at}.lending_limit.{name}",
                    f"cannot lend {lend} GPUs: more than the team's quota ({team.quota_gpus(name)}); allowed 0..{team.quota_gpus(name)}")
        for j, tier in enumerate(team.tiers or []):
            if tier not in tiers:
                add(f"{at}.tiers[{j}]", f"unknown tier {tier!r}; defined tiers: {', '.join(tiers)}")
        if len(issues) > issues_before:
            continue  # the capacity arithmetic below needs valid references
        for name in team.products():
            guaranteed[name].append((team.name, cfg.guaranteed_slots(team, name)))
            if cfg.capacity is not None and name in cfg.capacity:
                cap = cfg.capacity[name]
                if cfg.guaranteed_slots(team, name) > cap * SLOTS_PER_GPU:
                    add(f"{at}.quota.{name}",
                        f"quota of {format_gpus(cfg.guaranteed_slots(team, name))} GPUs exceeds the declared capacity "
                        f"capacity.{name} = {cap}; allowed 0..{cap}")
                elif cfg.team_slots(team, name) > cap * SLOTS_PER_GPU:
                    add(f"{at}.borrowing_limit.{name}",
                        f"quota + borrowing = {format_gpus(cfg.team_slots(team, name))} GPUs exceeds the declared "
                        f"capacity capacity.{name} = {cap}")

    if cfg.capacity is not None:
        for name, cap in cfg.capacity.items():
            if not known_product(f"capacity.{name}", name):
                continue
            total = sum(slots for _, slots in guaranteed[name])
            if total > cap * SLOTS_PER_GPU:
                parts = ", ".join(f"{team} {format_gpus(slots)}" for team, slots in guaranteed[name] if slots)
                add(f"capacity.{name}",
                    f"the teams' guaranteed quotas sum to {format_gpus(total)} GPUs ({parts}), more than the declared "
                    f"capacity of {cap}; lower the quotas or raise the capacity")
    return issues


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml parser when present
    """PyYAML keeps the last of duplicate keys silently; a repeated quota key must be an error.

    Numbers as YAML 1.2 (the core schema) reads them: PyYAML follows YAML 1.1, where `0x10` is 16,
    `010` is 8, `1_0` is 10 and `1:20` is 80, so a quota could silently change. Here only plain
    decimal integers and floats are numbers; any other form stays text and fails validation with
    the field named. (`yes`/`no` stay booleans: the schema's StrictInt/StrictBool refuse them where
    they do not belong.)"""

    yaml_implicit_resolvers = {
        first: [(tag, regex) for tag, regex in resolvers
                if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
        for first, resolvers in getattr(yaml, "CSafeLoader", yaml.SafeLoader).yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"a mapping key must be a plain value, not a {type(key).__name__}", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
# decimal, also with a leading 0 (YAML 1.1's constructor reads 010 as octal 8)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", lambda loader, node: int(loader.construct_scalar(node), 10))
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+.0123456789"))


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else problem


_CACHE: dict[str, tuple[tuple[int, int], QuotaConfig]] = {}


def load_config_cached(path: str | Path) -> QuotaConfig:
    """`load_config` once per process and file version: the DAG processor parses many tasks that
    name the same file, and a changed file (mtime or size) is read again. Errors are not cached."""
    key = str(Path(path).resolve())
    try:
        st = os.stat(key)
    except OSError:
        return load_config(path)  # reports the unreadable file
    version = (st.st_mtime_ns, st.st_size)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] == version:
        return hit[1]
    cfg = load_config(path)
    _CACHE[key] = (version, cfg)
    return cfg
