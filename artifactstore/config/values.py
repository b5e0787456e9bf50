"""One setting's value: booleans, numbers, sizes, names, ports, each checked with a
one-line error that names the variable, so a typo fails before anything opens."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from artifactstore.config.defaults import (
    DEFAULT_LOCAL_TIER_BYTES,
    DEFAULT_METRICS_ADDR,
    ENV_PREFIX,
    MAX_SECS,
    SINGLE_FLIGHT_MODES,
)
from artifactstore.errors import ConfigError
from artifactstore.formats.names import check_name

if TYPE_CHECKING:
    from artifactstore.formats.signing import SigningKey, TrustedKeys

T = TypeVar("T")
D = TypeVar("D")

# A setting's parser (the table's `parse`): its variable's name (for the error), the value
# given (a string from the environment, or what configure() was passed), its default.
Parse = Callable[[str, Any, Any], T]

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


def seconds(*, minimum: float = 0.0, maximum: float = MAX_SECS) -> Parse[float]:
    """A duration within bounds (by default 0 to a day)."""
    return lambda name, value, _: parse_float(name, value, minimum=minimum, maximum=maximum)


def count(maximum: int) -> Parse[int]:
    """A whole number of things, 1 to `maximum` (a fraction is rounded down)."""
    return lambda name, value, _: int(parse_float(name, value, minimum=1, maximum=maximum))


def boolean(name: str, value: Any, default: Any) -> bool:
    return parse_bool(name, value)


def auto_bool(name: str, value: Any, default: Any) -> bool | None:
    return parse_auto_bool(name, value)


def namespace(name: str, value: Any, default: Any) -> str:
    return check_namespace(str(value))


def single_flight(name: str, value: Any, default: Any) -> str:
    return parse_single_flight(value)


def tier(name: str, value: Any, default: Any) -> str | None:
    return parse_tier(value)


def tier_size(name: str, value: Any, default: Any) -> int:
    return parse_tier_size(value)


def program(name: str, value: Any, default: Any) -> str | None:
    """A working set's name: bounded, as it names a record in the store."""
    return str(value)[:1024] if value else None


def endpoint(name: str, value: Any, default: Any) -> str | None:
    """An S3-compatible endpoint: a URL with a host, checked before boto3 sees it."""
    if value == "":
        return None
    if not re.match(r"^https?://[^/\s]+", str(value)):
        raise ConfigError(
            f"invalid S3 endpoint {value!r}: use http(s)://host:port, e.g. http://127.0.0.1:9000"
        )
    return str(value)


def signing_key(name: str, value: Any, default: Any) -> SigningKey | None:
    """ARTSTORE_SIGNING_KEY: the path of a .key file (never the key itself)."""
    if value == "":
        return None
    from artifactstore.config.keyfiles import load_signing_key
    from artifactstore.formats.signing import SigningKey

    if isinstance(value, SigningKey):
        return value
    return load_signing_key(str(Path(str(value)).expanduser()))


def trusted_keys(name: str, value: Any, default: Any) -> TrustedKeys | None:
    """ARTSTORE_TRUSTED_KEYS: comma-separated .pub files or NAME:BASE64 public keys."""
    if value == "":
        return None
    from artifactstore.config.keyfiles import load_trusted_keys
    from artifactstore.formats.signing import TrustedKeys

    if isinstance(value, TrustedKeys):
        return value
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    return load_trusted_keys(str(value))


def check_namespace(namespace: str) -> str:
    return check_name(namespace, "namespace")


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


def limit(name: str, value: Any, default: D) -> int | D:
    """A size limit (`500M`, `4GiB`, or bytes as an int): at least one byte."""
    from artifactstore.formats.sizes import parse_size

    if value == "":
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        try:
            size = parse_size(str(value))
        except ConfigError as exc:
            raise ConfigError(f"{name}: {exc}") from None
    if size < 1:
        raise ConfigError(f"invalid value {value!r} for {name}: must be at least 1 byte, e.g. 4GiB")
    return size
