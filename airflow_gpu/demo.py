"""`make demo`: the seed scenario end to end on the local cluster. Grows as the pieces land."""

from __future__ import annotations

import sys


def main() -> int:
    print("airflow-gpu demo: the seed scenario is not wired end to end yet.")
    print("Built so far: see README.md, section 'Status'.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
