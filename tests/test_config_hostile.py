"""Issue 10, item 6: hostile or careless quota files make the CLI exit 2 naming the file and the
field, within 5 s and 500 MB (an alias bomb, wrong encodings, odd keys, huge numbers, bad node labels)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

SEED = Path(__file__).resolve().parents[1] / "examples" / "seed-quotas.yaml"


def _seed() -> dict:
    return yaml.safe_load(SEED.read_text())


def _alias_bomb() -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        refs = ",".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\nproducts: *a9\n"


def _with(mutate) -> str:
    data = _seed()
    mutate(data)
    return yaml.safe_dump(data, sort_keys=False)


def _label(value):
    return lambda d: d["products"][0].__setitem__("node_label", value)


def _second_product_same_label(d):
    twin = dict(d["products"][0], name="a100-twin")
    d["products"].append(twin)


CASES = {
    "alias bomb": (_alias_bomb().encode(), "expands to more than"),
    "deep": (b"products: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nesting depth"),
    "utf-16": (SEED.read_text().encode("utf-16"), "not UTF-8 text"),
    "latin-1": ("# caf\u00e9\n".encode("latin-1") + SEED.read_bytes(), "not UTF-8 text (byte 0xe9"),
    "complex key": (b"? [a, b]\n: 1\n", "a mapping key must be a plain value"),
    "5000 digits": (SEED.read_bytes().replace(b"priority: 1000000\n", b"priority: " + b"9" * 5000 + b"\n", 1),
                    "not valid YAML"),
    "quota 10**30": (_with(lambda d: d["teams"][0]["quota"].__setitem__("a100-80gb", 10**30)).encode(),
                     "teams[0].quota.a100-80gb"),
    "label with spaces": (_with(_label("NVIDIA A100")).encode(), "products[0].node_label"),
    "empty label": (_with(_label("")).encode(), "products[0].node_label"),
    "300-char label": (_with(_label("A" * 300)).encode(), "products[0].node_label"),
    "shared label": (_with(_second_product_same_label).encode(), "products[2].node_label: node_label"),  # the seed has two
    # YAML 1.1 number forms stay text (YAML 1.2): a quota never changes silently (0x10 was 16, 1:20 was 80)
    "hex quota": (SEED.read_bytes().replace(b"a100-80gb: 8", b"a100-80gb: 0x10", 1), ".quota.a100-80gb"),
    "sexagesimal quota": (SEED.read_bytes().replace(b"a100-80gb: 8", b"a100-80gb: 1:20", 1), ".quota.a100-80gb"),
    "underscore quota": (SEED.read_bytes().replace(b"a100-80gb: 8", b"a100-80gb: 1_6", 1), ".quota.a100-80gb"),
    "infinite memory": (_with(lambda d: d["products"][0].__setitem__("memory_gb", float("inf"))).encode(),
                        "products[0].memory_gb"),
    "kube-system namespace": (_with(lambda d: d["teams"][0].__setitem__("namespace", "kube-system")).encode(),
                              "belongs to the cluster or to airflow-gpu itself"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_config_exits_2_naming_the_field_fast_and_small(case, tmp_path):
    content, expected = CASES[case]
    path = tmp_path / "quotas.yaml"
    path.write_bytes(content)
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow-home")}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "airflow_gpu", "pools", "render-k8s", "--config", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        out, err = proc.communicate(timeout=5)
    finally:
        proc.kill()
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, err.decode()[-2000:]
    message = err.decode()
    assert str(path) in message and expected in message, message[-2000:]
    assert elapsed < 5
    assert "Traceback" not in message


def test_alias_bomb_memory_is_bounded(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    code = ("import resource, sys\nfrom airflow_gpu.config import load_config, ConfigError\n"
            "try:\n    load_config(sys.argv[1])\nexcept ConfigError as e:\n    print(e)\n"
            "print('maxrss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=5)
    assert "expands to more than" in out.stdout, out.stdout + out.stderr
    maxrss_mb = int(out.stdout.split("maxrss_kb")[1]) / 1024
    assert maxrss_mb < 500
