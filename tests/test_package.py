"""The package installs, its entry points resolve, and its CLI starts."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points


def test_provider_entry_point_resolves():
    (ep,) = [e for e in entry_points(group="apache_airflow_provider") if e.value.startswith("airflow_gpu")]
    info = ep.load()()
    assert info["package-name"] == "airflow-gpu"
    assert info["versions"]


def test_cli_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "airflow_gpu", "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for command in ("pools", "cluster", "simulate", "scheduler"):
        assert command in out.stdout


def test_constants_have_one_prefix():
    from airflow_gpu import constants

    ours = [v for k, v in vars(constants).items() if k.startswith(("LABEL_", "ANNOTATION_")) and "airflow-gpu" in str(v)]
    assert ours and all(v.startswith("airflow-gpu.io/") for v in ours)
