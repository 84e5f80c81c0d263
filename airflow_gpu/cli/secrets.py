"""Secrets for the command line come from a file or the environment, never from argv (argv is
visible to every local user in `ps`)."""

from __future__ import annotations

import os
from pathlib import Path


class SecretError(ValueError):
    pass


def read_secret(file: str | None, env: str, flag: str) -> str | None:
    """The secret in `file` (surrounding whitespace stripped), else $env, else None."""
    if file:
        try:
            value = Path(file).read_text().strip()
        except OSError as exc:
            raise SecretError(f"{flag} {file}: {exc.strerror}; give a readable file holding the secret") from None
        if not value:
            raise SecretError(f"{flag} {file}: the file is empty; write the secret into it")
        return value
    return os.environ.get(env) or None
