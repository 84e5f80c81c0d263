"""`airflow-gpu simulate`: not built yet."""


def register(subparsers) -> None:
    parser = subparsers.add_parser("simulate", help="(not built yet)")
    parser.set_defaults(func=_not_built)


def _not_built(args) -> int:
    print("airflow-gpu simulate: not built yet")
    return 2
