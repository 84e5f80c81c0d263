"""What many stored objects repeat, kept once in memory (Store(share=...) calls a hook per kind on each
write). Two ways:
- read-only values shared by every object that has them, such as the kube-api-access volume every pod
  carries (~2 KB of dicts and lists per pod otherwise). JSON encoding and equality treat them as the plain
  dict and list they subclass, so serving is unchanged. Writes raise TypeError: a shared value can never
  change through one object; copies (deep_copy, copy.deepcopy, dict(), list()) are plain and writable.
- interned strings: a decoded request body has its own copy of every string (image, command, label
  values, defaults); sys.intern keeps one of each (mortal: freed with the last object using it)."""

from __future__ import annotations

from sys import intern


def _read_only(self, *args, **kwargs):
    raise TypeError("a value shared by stored objects is read-only: copy it before changing it")


class FrozenDict(dict):
    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = setdefault = pop = popitem = clear = update = _read_only

    def __copy__(self) -> dict:
        return dict(self)

    def __deepcopy__(self, memo) -> dict:
        import copy

        return {k: copy.deepcopy(v, memo) for k, v in self.items()}


class FrozenList(list):
    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = append = extend = insert = pop = remove = clear = sort = \
        reverse = _read_only

    def __copy__(self) -> list:
        return list(self)

    def __deepcopy__(self, memo) -> list:
        import copy

        return [copy.deepcopy(v, memo) for v in self]


def freeze(value):
    """A read-only deep copy of a JSON value."""
    if isinstance(value, dict):
        return FrozenDict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return FrozenList(freeze(v) for v in value)
    return value


def intern_strings(value) -> None:
    """Intern, in place, the strings of a decoded JSON value (shared read-only parts are left alone)."""
    if isinstance(value, dict):
        if isinstance(value, FrozenDict):
            return
        for k, v in value.items():
            if type(v) is str:
                value[k] = intern(v)
            elif isinstance(v, (dict, list)):
                intern_strings(v)
    elif not isinstance(value, FrozenList):
        for i, v in enumerate(value):
            if type(v) is str:
                value[i] = intern(v)
            elif isinstance(v, (dict, list)):
                intern_strings(v)
