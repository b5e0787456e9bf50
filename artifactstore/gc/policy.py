"""What gc is asked to remove: the policy, its size limit and the jaxlib versions it drops."""

from __future__ import annotations

from dataclasses import dataclass

from artifactstore.errors import ConfigError
from artifactstore.index.quotas import get_quota
from artifactstore.store import StoreParts

# An unreferenced object younger than this may be a put in flight (its entry not
# committed yet): gc never deletes it, and verify does not call it an orphan.
DEFAULT_GRACE_SECS = 3600.0


@dataclass(frozen=True)
class Policy:
    max_bytes: int | None = None
    older_than_secs: float | None = None
    jaxlib_older_than: str | None = None
    grace_secs: float = DEFAULT_GRACE_SECS
    reconcile: bool = True
    dry_run: bool = False
    # Drop entries whose object is gone even when they are more than a few and over
    # MISSING_SHARE of the namespace (artifactstore.gc.reconcile): a wrong bucket or
    # objects deleted by hand look like that, and the entries would be lost for good.
    allow_missing: bool = False


def effective_limit(parts: StoreParts, max_bytes: int | None) -> int | None:
    """The smaller of `max_bytes` and the namespace's quota (None: no size limit)."""
    quota = get_quota(parts.engine, parts.namespace)
    limits = [v for v in (max_bytes, quota) if v is not None]
    return min(limits) if limits else None


def old_jaxlib_versions(present: list[str], older_than: str) -> list[str]:
    """The versions in `present` strictly older than `older_than` (PEP 440 order);
    unparsable versions are kept, never guessed at."""
    from packaging.version import InvalidVersion, Version

    try:
        bound = Version(older_than)
    except InvalidVersion:
        raise ConfigError(
            f"invalid jaxlib version {older_than!r}: use a version such as 0.4.30"
        ) from None
    old = []
    for text in present:
        try:
            if Version(text) < bound:
                old.append(text)
        except InvalidVersion:
            continue
    return sorted(old)
