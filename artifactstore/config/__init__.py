"""Settings from `configure()` arguments and `ARTSTORE_*` environment variables, checked
before anything opens: `resolve()` turns them into one immutable `Settings`.

The parts: `table` (every setting, declared once, as an attribute of `Settings`; `rows`:
what a row is), `variables` (the other `ARTSTORE_*` names, and the typo check), `defaults`
(every default and why), `values` (one value: booleans, numbers, sizes, names), `urls`
(where objects and the index live), `settings` (`resolve`); `host` (this host's platform
facts, for the fingerprint) and `keyfiles` (signing keys read from and written to files)
are imported where needed.
"""

from __future__ import annotations

from artifactstore.config import defaults
from artifactstore.config.defaults import ENV_PREFIX
from artifactstore.config.rows import Var
from artifactstore.config.settings import default_cache_dir, resolve
from artifactstore.config.table import SETTINGS, Settings, help_text
from artifactstore.config.urls import BlobLocation, parse_blob_url, parse_index_url
from artifactstore.config.values import check_namespace, parse_bool, parse_float
from artifactstore.config.variables import (
    VARIABLES,
    from_environment,
    off_line,
    to_environment,
    typo_lines,
)
from artifactstore.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "SETTINGS",
    "VARIABLES",
    "BlobLocation",
    "ConfigError",
    "Settings",
    "Var",
    "check_namespace",
    "default_cache_dir",
    "defaults",
    "from_environment",
    "help_text",
    "off_line",
    "parse_blob_url",
    "parse_bool",
    "parse_float",
    "parse_index_url",
    "resolve",
    "to_environment",
    "typo_lines",
]
