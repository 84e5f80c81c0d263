"""`make bench`: every benchmark, side by side. Each module under bench/ has a main()."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import bench


def main(argv: list[str]) -> int:
    wanted = set(argv)
    names = [m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_")]
    for name in sorted(names):
        if wanted and name not in wanted:
            continue
        print(f"=== bench.{name} ===", flush=True)
        importlib.import_module(f"bench.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
