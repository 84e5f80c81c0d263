"""The package installs, its entry points resolve, and its CLI starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from importlib.metadata import entry_points

ROOT = Path(__file__).resolve().parents[1]


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


# what only the local cluster needs: the `localcluster` extra (an Airflow image running just the operator,
# the triggers, the scheduler and the UI plugin installs without it)
LOCALCLUSTER_ONLY = {"websockets": "websockets", "pyjwt": "jwt", "pyseccomp": "pyseccomp", "dumb-init": None}


def test_local_cluster_dependencies_are_an_extra():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = {_dist_name(d) for d in project["dependencies"]}
    extra = {_dist_name(d) for d in project["optional-dependencies"]["localcluster"]}
    assert set(LOCALCLUSTER_ONLY) <= extra
    assert not set(LOCALCLUSTER_ONLY) & required
    assert any(_dist_name(d) == "airflow-gpu" and "localcluster" in d for d in project["optional-dependencies"]["test"])


def test_only_the_local_cluster_imports_its_extra():
    import ast

    modules = {m for m in LOCALCLUSTER_ONLY.values() if m}
    offenders = []
    for path in (ROOT / "airflow_gpu").rglob("*.py"):
        if "localcluster" in path.relative_to(ROOT / "airflow_gpu").parts[0]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in modules]
    assert not offenders


def test_product_runs_without_the_local_cluster():
    """The operator, triggers, scheduler, UI plugin, policy and CLI import with the local cluster's
    package and its extra made unimportable; `cluster up` then names the extra to install."""
    blocker = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'pyseccomp'} or name.startswith('airflow_gpu.localcluster'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    imports = ("import airflow_gpu.operators, airflow_gpu.triggers.gang, airflow_gpu.scheduler.loop, "
               "airflow_gpu.plugin, airflow_gpu.policy, airflow_gpu.cli\n"
               "assert not [m for m in sys.modules if m.startswith('airflow_gpu.localcluster')]\n")
    out = subprocess.run([sys.executable, "-c", blocker + imports], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    # the package present, one of its extra's modules missing
    blocked_extra = blocker.replace("or name.startswith('airflow_gpu.localcluster')", "")
    out = subprocess.run([sys.executable, "-c", blocked_extra + "from airflow_gpu.cli.cluster import missing_extra\n"
                          "print(missing_extra())\n"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "pip install 'airflow-gpu[localcluster]'" in out.stdout, out.stdout


def _dist_name(requirement: str) -> str:
    import re

    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower()
