"""One setting's value: booleans, numbers, sizes, names, ports, each checked with a
one-line error that names the variable, so a typo fails before anything opens."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from artifactstore.config.defaults import (
    DEFAULT_LOCAL_TIER_BYTES,
    DEFAULT_METRICS_ADDR,
    ENV_PREFIX,
    MAX_SECS,
    SINGLE_FLIGHT_MODES,
)
from artifactstore.errors import ConfigError

_NAMESPACE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_bool(name: str, value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"invalid boolean {value!r} for {name}: use 1/0, true/false, yes/no")


def parse_auto_bool(name: str, value: str | bool | None) -> bool | None:
    """A boolean, or None for `auto` (the default: the feature decides where it helps)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        return parse_bool(name, value)
    except ConfigError:
        raise ConfigError(f"invalid value {value!r} for {name}: use auto, 1 or 0") from None


def parse_float(
    name: str, value: str | float, *, minimum: float = 0.0, maximum: float = MAX_SECS
) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"invalid number {value!r} for {name}: use e.g. 0.5") from None
    if not minimum <= number <= maximum:  # also false for nan
        raise ConfigError(
            f"invalid value {value!r} for {name}: must be >= {minimum:g} and <= {maximum:g}"
        )
    return number


def parse_count(env_name: str, value: Any, maximum: int) -> int:
    """A whole number of things, 1 to `maximum` (a fraction is rounded down)."""
    return int(parse_float(ENV_PREFIX + env_name, value, minimum=1, maximum=maximum))


def check_namespace(namespace: str) -> str:
    if not _NAMESPACE_RE.fullmatch(namespace):
        raise ConfigError(
            f"invalid namespace {namespace!r}: use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return namespace


def parse_metrics(values: dict[str, Any]) -> dict[str, Any]:
    """metrics_port and metrics_addr, or none of them and why (`metrics_error`)."""
    try:
        return {
            "metrics_port": parse_port(values.get("metrics_port")),
            "metrics_addr": parse_addr(values.get("metrics_addr")),
        }
    except ConfigError as exc:
        return {"metrics_port": None, "metrics_error": f"{exc}; the store works without them"}


def parse_single_flight(value: Any) -> str:
    """ARTSTORE_SINGLE_FLIGHT: auto (the default), or a boolean."""
    text = str(value).strip().lower()
    if text in SINGLE_FLIGHT_MODES:
        return text
    try:
        return "on" if parse_bool(ENV_PREFIX + "SINGLE_FLIGHT", value) else "off"
    except ConfigError:
        raise ConfigError(
            f"invalid value {value!r} for {ENV_PREFIX}SINGLE_FLIGHT: use auto, 1 or 0"
        ) from None


def parse_port(value: Any) -> int | None:
    """ARTSTORE_METRICS_PORT: 1 to 65535; 0 or empty: metrics not served."""
    if value is None or value == "":
        return None
    name = ENV_PREFIX + "METRICS_PORT"
    if isinstance(value, bool) or not str(value).strip().isdigit():
        raise ConfigError(f"invalid port {value!r} for {name}: use e.g. 9464 (0: off)")
    port = int(str(value).strip())
    if port > 65535:
        raise ConfigError(f"invalid port {value!r} for {name}: must be <= 65535 (0: off)")
    return port or None


def parse_addr(value: Any) -> str:
    """ARTSTORE_METRICS_ADDR: the address the metrics port is bound to (a host name or IP)."""
    if value is None or value == "":
        return DEFAULT_METRICS_ADDR
    text = str(value).strip()
    if not re.fullmatch(r"[A-Za-z0-9._:-]{1,255}", text):
        raise ConfigError(
            f"invalid address {text!r} for {ENV_PREFIX}METRICS_ADDR: use an IP address or "
            "host name, e.g. 0.0.0.0 to serve every interface"
        )
    return text


def parse_tier(value: Any) -> str | None:
    if value is None or value == "":
        return None
    text = str(value).strip()
    if text.lower() in _FALSE or text.lower() == "none":
        return "off"
    return str(Path(text).expanduser().resolve())


def parse_tier_size(value: Any) -> int:
    if value is None or value == "":
        return DEFAULT_LOCAL_TIER_BYTES
    if isinstance(value, int):
        return value
    from artifactstore.formats.sizes import parse_size

    return parse_size(str(value))


def parse_limit(env_name: str, value: Any, default: int) -> int:
    """A size limit (`500M`, `4GiB`, or bytes as an int): at least one byte."""
    from artifactstore.formats.sizes import parse_size

    if value is None or value == "":
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        try:
            size = parse_size(str(value))
        except ConfigError as exc:
            raise ConfigError(f"{ENV_PREFIX}{env_name}: {exc}") from None
    if size < 1:
        raise ConfigError(
            f"invalid value {value!r} for {ENV_PREFIX}{env_name}: must be at least 1 byte, "
            "e.g. 4GiB"
        )
    return size
