"""Size and depth bounds of parsed documents (YAML, JSON). YAML aliases make a small text expand to
a huge tree that is shared in memory but copied by every later walk (validation, JSON encoding), so
untrusted documents are measured as expanded trees, with time bounded by the limit, before use."""

from __future__ import annotations


def tree_problem(data: object, max_values: int, max_depth: int) -> str | None:
    """Why `data` is too big (more than max_values values counting alias expansions, or nested
    deeper than max_depth), or None. Stops as soon as a bound is passed."""
    count, stack = 0, [(data, 1)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if count > max_values:
            return f"more than {max_values:,} values (YAML aliases expand to copies)"
        if isinstance(item, dict):
            if depth > max_depth:
                return f"nested deeper than {max_depth} levels"
            stack.extend((v, depth + 1) for v in item.values())
            count += len(item)
        elif isinstance(item, list):
            if depth > max_depth:
                return f"nested deeper than {max_depth} levels"
            stack.extend((v, depth + 1) for v in item)
    return None
