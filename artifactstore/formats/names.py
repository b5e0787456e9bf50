"""The one rule for the names a store's paths and records carry: namespaces (a path
component and a key prefix) and signing keys' names (in every signature frame).

One rule, so that a name valid as one is valid as the other and neither can hold a
path separator, a newline or `..`.
"""

from __future__ import annotations

import re

from artifactstore.errors import ConfigError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def check_name(name: str, what: str) -> str:
    """`name` if it follows the rule, else ConfigError naming `what` it was meant to be."""
    if not NAME_RE.fullmatch(name):
        raise ConfigError(
            f"invalid {what} {name[:64]!r}: use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name
