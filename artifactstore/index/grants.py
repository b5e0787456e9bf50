"""What a PostgreSQL login may do with the index: table privileges and namespace grants.

Why here: `artstore doctor` asks before a program is refused, and the questions are
SQL about the roles of infra/policies/postgres-roles.sql (privileges, row-level
security, `artstore_ns_member`); the answer, not the SQL, is doctor's to word.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, text

# What a reader and a writer need of a PostgreSQL index (infra/policies/postgres-roles.sql).
READS = (("entries", "SELECT"), ("objects", "SELECT"))
WRITES = (
    ("entries", "INSERT"),
    ("entries", "UPDATE"),
    ("objects", "INSERT"),
    ("usage", "INSERT"),
    ("counters", "INSERT"),
)


@dataclass(frozen=True)
class Access:
    missing: list[str]  # "PRIVILEGE on table" this login lacks, in READS/WRITES order
    granted: bool  # it sees the namespace's rows (asked only when nothing is missing)


def login_access(engine: Engine, namespace: str, *, write: bool) -> Access:
    """Which table privileges the login lacks (a reader's, or a writer's with `write`),
    and, when none, whether row-level security lets it see `namespace`'s rows: it
    bypasses or owns the policy, is the gc role, or was granted the namespace."""
    needed = (*READS, *WRITES) if write else READS
    privilege = text("SELECT has_table_privilege(current_user, :t, :p)")
    with engine.connect() as conn:
        missing = [
            f"{p} on {t}"
            for t, p in needed
            if not conn.execute(privilege, {"t": t, "p": p}).scalar()
        ]
        if missing:
            return Access(missing, granted=False)
        bypass = conn.execute(
            text(
                "SELECT NOT c.relrowsecurity OR r.rolsuper OR r.rolbypassrls"
                " OR pg_has_role(current_user, c.relowner, 'MEMBER')"
                " OR EXISTS (SELECT 1 FROM pg_roles g WHERE g.rolname = 'artstore_gc'"
                "            AND pg_has_role(current_user, g.oid, 'MEMBER'))"
                " FROM pg_class c JOIN pg_roles r ON r.rolname = current_user"
                " WHERE c.oid = 'entries'::regclass"
            )
        ).scalar()
        if bypass:
            return Access([], granted=True)
        member = text("SELECT artstore_ns_member(:ns)")
        has_fn = conn.execute(text("SELECT to_regprocedure('artstore_ns_member(text)')")).scalar()
        granted = has_fn is not None and conn.execute(member, {"ns": namespace}).scalar()
    return Access([], granted=bool(granted))
