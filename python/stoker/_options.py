"""Store options and JSON for the native module (shared by the pipeline API and stoker.io)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from . import _native

#: Other names accepted for the store's keys: short ones, boto3's, and the CLI's flags
#: (``--no-sign-request``, ``--cache-size``).
STORE_ALIASES = {
    "access_key": "access_key_id",
    "secret_key": "secret_access_key",
    "token": "session_token",
    "endpoint_url": "endpoint",
    "no_sign_request": "skip_signature",
    "cache_size": "cache_disk_bytes",
}

STORE_KEYS = frozenset(_native.STORE_OPTION_KEYS)

#: The format options, each with the format that reads it.
FORMAT_KEYS: dict[str, str] = dict(_native.FORMAT_OPTION_KEYS)


def store_key(key: str) -> str:
    """``key`` as the store names it: case and ``-`` against ``_`` do not matter (as on
    the CLI's ``-o KEY=VALUE``), aliases become the key they stand for."""
    k = key.lower().replace("-", "_")
    return STORE_ALIASES.get(k, k)


def is_store_key(key: str) -> bool:
    """Whether ``key`` is a store option (a key of ``StoreOptions``, an alias, or an
    ``aws_*``/``google_*``/``azure_*`` key passed to object_store)."""
    k = store_key(key)
    return k in STORE_KEYS or k.startswith(("aws_", "google_", "azure_"))


def unknown_option(key: str, where: str) -> ValueError:
    """The error for a keyword that is neither a store nor a format option."""
    stores = ", ".join(sorted(STORE_KEYS | STORE_ALIASES.keys()))
    formats = ", ".join(f"{k} ({f})" for k, f in FORMAT_KEYS.items())
    return ValueError(
        f"{where}: unknown option {key!r}: not a store option ({stores}, or any aws_*, "
        f"google_* or azure_* key) nor a format option ({formats})"
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
        pairs.append((store_key(key), text))
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
