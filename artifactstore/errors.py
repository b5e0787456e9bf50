"""Exceptions that carry a one-line, user-facing message.

Every error the CLI or the JAX adapter reports to a person derives from
`ArtstoreError`, so the top level can print `str(exc)` and exit without a
traceback. Messages name the problem and the fix, and never contain secrets.
"""

from __future__ import annotations

from artifactstore.redact import redact


class ArtstoreError(Exception):
    """An error whose message is fit to show a user as one line.

    Its message is redacted when the error is made: a URL or setting quoted in it
    (e.g. a malformed index URL) is shown without its password or tokens, wherever
    the error ends up (the CLI, a log line, the traceback of a program calling
    `configure()`)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class ConfigError(ArtstoreError):
    """Bad configuration: URL, option, size, namespace."""


class UnsafeDirectory(ConfigError):
    """A local tier or store directory another user could write (or did create): it is
    not used, so that nobody can plant an executable this process would load."""


class StoreUnavailable(ArtstoreError):
    """The object store or index cannot be reached or answered too slowly."""


class ObjectUnreadable(StoreUnavailable):
    """The store answered, about one object only (archived, gone, a checksum mismatch):
    a miss for that object, never counted against the store's breaker."""


class SchemaMismatch(ArtstoreError):
    """The index schema is older or newer than this version understands."""


class ReadOnlyError(ArtstoreError):
    """A write was attempted through a read-only store."""


class PrivilegeRefused(ReadOnlyError):
    """The database role may not make this write (its grants or row-level security)."""


class CorruptObject(ArtstoreError):
    """Stored bytes do not match their digest or envelope."""


class OverLimit(CorruptObject):
    """Bytes bigger than this reader's limits (ARTSTORE_MAX_OBJECT_SIZE, or the
    executable's declared size over ARTSTORE_MAX_EXECUTABLE_SIZE): refused before
    they are read or inflated, but not damaged, so never quarantined (another
    reader may allow them)."""


class IndexDamaged(ArtstoreError):
    """The index is corrupt, missing or does not belong to the objects it indexes."""


class LeaseHeld(ArtstoreError):
    """Another process holds the lease (e.g. another `artstore gc` on the namespace)."""


def one_line(exc: BaseException) -> str:
    """First line of an exception, type-prefixed, secrets redacted: how any exception
    from outside the package (a driver, botocore, the OS) is quoted in a message."""
    lines = redact(str(exc)).strip().splitlines()
    first = lines[0] if lines else ""
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text[:300]


class NamedNotFound(ArtstoreError, LookupError):
    """No executable of that name and version that this host can load or rebuild."""


class NamedBuildError(ArtstoreError):
    """A function that cannot become a named executable (host callbacks, effects,
    arguments JAX passes implicitly), or bytes that would not load."""
