"""`airflow-gpu` command line. Each command group lives in its own module with `register(subparsers)`,
imported only when the program starts so that `airflow-gpu --help` stays fast."""

from __future__ import annotations

import argparse
import importlib
import sys

# command name -> module in this package that registers it
COMMAND_MODULES = {
    "pools": "pools",
    "cluster": "cluster",
    "simulate": "simulate",
    "scheduler": "scheduler",
    "queue": "queue",
    "report": "queue",
    "demo": "demo",
    "dev": "dev",
    "soak": "soak",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="airflow-gpu", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in dict.fromkeys(COMMAND_MODULES.values()):
        module = importlib.import_module(f"{__name__}.{module_name}")
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
