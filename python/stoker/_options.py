"""Store options and JSON for the native module (shared by the pipeline API and stoker.io)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from . import _native

#: Short names accepted for the store's keys.
STORE_ALIASES = {
    "access_key": "access_key_id",
    "secret_key": "secret_access_key",
    "token": "session_token",
    "endpoint_url": "endpoint",
}

STORE_KEYS = frozenset(_native.STORE_OPTION_KEYS)


def is_store_key(key: str) -> bool:
    """Whether ``key`` is a store option (a key of ``StoreOptions``, an alias, or an
    ``aws_*``/``google_*``/``azure_*`` key passed to object_store)."""
    return (
        key in STORE_KEYS
        or key in STORE_ALIASES
        or key.startswith(("aws_", "google_", "azure_"))
    )


def store_pairs(options: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Store options as the ``(key, text)`` pairs the native module takes; ``None`` values
    are left out (the store's default, or the environment, applies)."""
    pairs = []
    for key, value in options.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float, str)):
            text = str(value)
        elif isinstance(value, os.PathLike):
            text = os.fspath(value)
        else:
            raise TypeError(
                f"store option {key}={value!r}: expected str, int, float, bool or a path"
            )
        pairs.append((STORE_ALIASES.get(key, key), text))
    return pairs


def _json_default(obj: Any) -> Any:
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    item = getattr(obj, "item", None)  # NumPy scalars
    if callable(item):
        return item()
    tolist = getattr(obj, "tolist", None)  # NumPy arrays
    if callable(tolist):
        return tolist()
    raise TypeError(f"{type(obj).__name__} cannot be an operator or spec value")


def to_json(obj: Any) -> str:
    """JSON text of a spec or an operator's parameters."""
    return json.dumps(obj, default=_json_default)
