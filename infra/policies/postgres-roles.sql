-- Least-privilege roles and per-namespace row-level security for a team index in
-- PostgreSQL (13+). Run as a superuser, connected to the artstore database, once
-- before the first `artstore db upgrade` (it lets artstore_admin create the schema)
-- and again after every upgrade (it grants on the tables migrations created):
--
--   psql -v ON_ERROR_STOP=1 -d artstore -f infra/policies/postgres-roles.sql
--
-- Then grant each login its namespaces (cluster-wide, once per login and namespace):
--
--   psql -d artstore -v namespace=team-a -v role=team_a_writer -f infra/policies/grant-namespace.sql
--
-- Passwords are read from the environment with psql's \getenv (psql 15+), so
-- they never live in this file: ARTSTORE_ADMIN_PASSWORD, ARTSTORE_WRITER_PASSWORD,
-- ARTSTORE_READER_PASSWORD, ARTSTORE_GC_PASSWORD. Unset ones are left alone (e.g.
-- with certificate or IAM authentication, or per-team logins instead).
--
-- Roles (group roles; each may log in itself, or per-team logins are made members,
-- e.g. CREATE ROLE team_a_writer LOGIN IN ROLE artstore_writer):
--   artstore_admin   owns the schema and runs `artstore db upgrade` (migrations).
--                    Table owners bypass row-level security: never use it for work.
--   artstore_gc      the operator / cron role: `artstore gc`, `quota set/rm`,
--                    `verify --repair` across every namespace. Reads and writes all
--                    rows of all tables but alembic_version; no DDL.
--   artstore_writer  CI / warm jobs and researchers who write: entries, objects, usage,
--                    counters, accesses, its `gc:NAMESPACE` lease and its compile
--                    leases (single-flight), only in the
--                    namespaces granted to the login; inserts fingerprints (checked
--                    against their digest); reads its namespaces' quotas. Enough for
--                    puts, `artstore rm` and the opt-in quota pass
--                    (ARTSTORE_ENFORCE_QUOTA) in its namespaces; cannot set quotas.
--   artstore_reader  workers with ARTSTORE_READ_ONLY=1: reads its namespaces' rows,
--                    and appends hits to `accesses` for them only. On insert a trigger
--                    clamps each row (0..1000000 hits, a time no later than now), so
--                    no row can pin an entry or overflow the fold; `artstore gc` folds
--                    them into entries so that LRU sees the cluster's reads.
-- Nobody but the admin (the owner) may write alembic_version.
--
-- Namespaces ARE a security boundary between reader and writer logins: row-level
-- security shows and lets them change only rows of namespaces whose role
-- artstore_ns_<namespace> they are members of (grant-namespace.sql). A login that is
-- a member of artstore_all_namespaces (namespace='*') sees every namespace: for a
-- single team, or to keep an existing deployment working while granting namespaces.
-- The gc role, the admin and superusers are not limited by namespace. Namespaces of
-- more than 51 characters cannot be granted (role names stop at 63): use shorter ones.
--
-- Safe to re-run: privileges are revoked and granted again in one transaction, so a
-- re-run also removes grants an earlier version of this file gave (e.g. the writer's
-- UPDATE on quotas and alembic_version). Tables a future migration adds get no
-- privileges until this file (updated with that migration) is run again.

\set ON_ERROR_STOP on

BEGIN;

-- Cluster-wide roles; two databases of one cluster may run this at once.
DO $$
DECLARE
  name text;
BEGIN
  FOREACH name IN ARRAY ARRAY['artstore_admin', 'artstore_gc', 'artstore_writer',
                              'artstore_reader', 'artstore_all_namespaces'] LOOP
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = name) THEN
      BEGIN
        IF name = 'artstore_all_namespaces' THEN
          EXECUTE format('CREATE ROLE %I NOLOGIN', name);
        ELSE
          EXECUTE format('CREATE ROLE %I LOGIN', name);
        END IF;
      EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;  -- created meanwhile by a run in another database
      END;
    END IF;
  END LOOP;
END
$$;

\getenv admin_password ARTSTORE_ADMIN_PASSWORD
\if :{?admin_password}
ALTER ROLE artstore_admin PASSWORD :'admin_password';
\endif
\getenv gc_password ARTSTORE_GC_PASSWORD
\if :{?gc_password}
ALTER ROLE artstore_gc PASSWORD :'gc_password';
\endif
\getenv writer_password ARTSTORE_WRITER_PASSWORD
\if :{?writer_password}
ALTER ROLE artstore_writer PASSWORD :'writer_password';
\endif
\getenv reader_password ARTSTORE_READER_PASSWORD
\if :{?reader_password}
ALTER ROLE artstore_reader PASSWORD :'reader_password';
\endif

-- Only these roles (and their members) may connect; only the admin may create objects.
DO $$
BEGIN
  EXECUTE format('REVOKE ALL ON DATABASE %I FROM PUBLIC', current_database());
  EXECUTE format('GRANT CONNECT, TEMPORARY ON DATABASE %I TO artstore_admin', current_database());
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO artstore_gc, artstore_writer, artstore_reader',
                 current_database());
END
$$;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE, CREATE ON SCHEMA public TO artstore_admin;
GRANT USAGE ON SCHEMA public TO artstore_gc, artstore_writer, artstore_reader;

-- Start from nothing: what earlier versions of this file granted goes, including
-- default privileges on future tables (a new table is granted here, deliberately).
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM artstore_gc, artstore_writer, artstore_reader;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM artstore_gc, artstore_writer, artstore_reader;
ALTER DEFAULT PRIVILEGES FOR ROLE artstore_admin IN SCHEMA public
  REVOKE ALL ON TABLES FROM artstore_gc, artstore_writer, artstore_reader;
ALTER DEFAULT PRIVILEGES FOR ROLE artstore_admin IN SCHEMA public
  REVOKE ALL ON SEQUENCES FROM artstore_gc, artstore_writer, artstore_reader;

-- Whether the current user may act for `ns`: a member of artstore_ns_<ns> or of
-- artstore_all_namespaces. A namespace without a role is nobody's (no error);
-- the name is compared untruncated, so a namespace too long for a role name never
-- matches a shorter one's role.
CREATE OR REPLACE FUNCTION artstore_ns_member(ns text) RETURNS boolean
  LANGUAGE sql STABLE SET search_path = pg_catalog AS $$
    SELECT EXISTS (
      SELECT 1 FROM pg_catalog.pg_roles r
      WHERE r.rolname IN ('artstore_ns_' || ns, 'artstore_all_namespaces')
        AND pg_catalog.pg_has_role(current_user, r.oid, 'MEMBER'))
  $$;

-- Whether the current user may hold the lease `lease`: `gc:NAMESPACE` (one gc per
-- namespace) or a compile lease `compile:KEY:H` (single-flight), where H is the first
-- 16 hex digits of sha256(NAMESPACE) (artifactstore/store/flight.py, lease_name), of a
-- namespace it is a member of (artstore_ns_member), or any if of artstore_all_namespaces.
CREATE OR REPLACE FUNCTION artstore_lease_member(lease text) RETURNS boolean
  LANGUAGE sql STABLE SET search_path = pg_catalog AS $$
    SELECT (lease LIKE 'gc:%' OR lease ~ '^compile:[A-Za-z0-9]{8,128}:[0-9a-f]{16}$')
      AND EXISTS (
        SELECT 1 FROM pg_catalog.pg_roles r
        WHERE pg_catalog.pg_has_role(current_user, r.oid, 'MEMBER')
          AND (r.rolname = 'artstore_all_namespaces'
               OR (lease LIKE 'gc:%' AND r.rolname = 'artstore_ns_' || substr(lease, 4))
               OR (lease LIKE 'compile:%' AND starts_with(r.rolname, 'artstore_ns_')
                   AND left(encode(sha256(convert_to(substr(r.rolname, 13), 'UTF8')), 'hex'), 16)
                       = split_part(lease, ':', 3))))
  $$;

-- Clamp a reader's access row as `fold_accesses` does (artifactstore/index/accesses.py,
-- ROW_HITS_MAX): a row counts 0..1000000 hits at a time no later than now.
CREATE OR REPLACE FUNCTION artstore_clamp_access() RETURNS trigger
  LANGUAGE plpgsql SET search_path = pg_catalog AS $$
  BEGIN
    NEW.hits := LEAST(GREATEST(NEW.hits, 0), 1000000);
    IF NEW.last_access > now() OR NOT isfinite(NEW.last_access) THEN
      NEW.last_access := now();
    END IF;
    RETURN NEW;
  END
  $$;

-- Grants and row-level security on the tables that exist now.
DO $$
DECLARE
  t text;
BEGIN
  IF to_regclass('public.alembic_version') IS NOT NULL THEN
    GRANT SELECT ON alembic_version TO artstore_gc, artstore_writer, artstore_reader;
  END IF;

  -- Tables with a namespace column: gc everywhere, readers and writers in theirs.
  FOREACH t IN ARRAY ARRAY['entries', 'objects', 'counters', 'usage', 'accesses', 'quotas',
                           'identities'] LOOP
    CONTINUE WHEN to_regclass('public.' || t) IS NULL;
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO artstore_gc', t);
    EXECUTE format('GRANT SELECT ON %I TO artstore_writer, artstore_reader', t);
    EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
    EXECUTE format('DROP POLICY IF EXISTS artstore_gc ON %I', t);
    EXECUTE format('CREATE POLICY artstore_gc ON %I TO artstore_gc USING (true)', t);
    EXECUTE format('DROP POLICY IF EXISTS artstore_namespace ON %I', t);
    EXECUTE format('CREATE POLICY artstore_namespace ON %I TO artstore_writer, artstore_reader '
                   'USING (artstore_ns_member(namespace)) '
                   'WITH CHECK (artstore_ns_member(namespace))', t);
    IF t IN ('entries', 'objects', 'counters', 'usage') THEN
      EXECUTE format('GRANT INSERT, UPDATE, DELETE ON %I TO artstore_writer', t);
    END IF;
  END LOOP;

  -- The store identity (artifactstore/store/identity.py): a writer's first entry binds its
  -- namespaces (insert only; rebinding is `artstore db bind --force`, as gc or admin).
  IF to_regclass('public.identities') IS NOT NULL THEN
    GRANT INSERT ON identities TO artstore_writer;
  END IF;

  IF to_regclass('public.entries') IS NOT NULL THEN
    GRANT USAGE ON SEQUENCE entries_id_seq TO artstore_gc, artstore_writer;
  END IF;

  IF to_regclass('public.accesses') IS NOT NULL THEN
    -- Readers append (and a writer started with ARTSTORE_READ_ONLY does too); a
    -- writer folds its namespaces' rows in its quota pass.
    GRANT INSERT ON accesses TO artstore_writer, artstore_reader;
    GRANT DELETE ON accesses TO artstore_writer;
    GRANT USAGE ON SEQUENCE accesses_id_seq TO artstore_gc, artstore_writer, artstore_reader;
    -- Runs for every inserting role, before the policy's check.
    DROP TRIGGER IF EXISTS artstore_clamp_access ON accesses;
    CREATE TRIGGER artstore_clamp_access BEFORE INSERT OR UPDATE ON accesses
      FOR EACH ROW EXECUTE FUNCTION artstore_clamp_access();
    DROP POLICY IF EXISTS artstore_namespace ON accesses;
    CREATE POLICY artstore_namespace ON accesses TO artstore_writer, artstore_reader
      USING (artstore_ns_member(namespace))
      WITH CHECK (artstore_ns_member(namespace) AND hits BETWEEN 0 AND 1000000
                  AND last_access <= now());
  END IF;

  -- Leases: a writer takes, renews and releases its own namespaces' gc lease
  -- (gc:NAMESPACE) and compile leases (compile:KEY:H, single-flight); see
  -- artstore_lease_member. Readers never hold one (they poll the object store's records).
  IF to_regclass('public.leases') IS NOT NULL THEN
    GRANT SELECT, INSERT, UPDATE, DELETE ON leases TO artstore_gc, artstore_writer;
    ALTER TABLE leases ENABLE ROW LEVEL SECURITY;
    DROP POLICY IF EXISTS artstore_gc ON leases;
    CREATE POLICY artstore_gc ON leases TO artstore_gc USING (true);
    DROP POLICY IF EXISTS artstore_namespace ON leases;
    CREATE POLICY artstore_namespace ON leases TO artstore_writer
      USING (artstore_lease_member(name))
      WITH CHECK (artstore_lease_member(name));
  END IF;

  -- Fingerprints are shared by every namespace and keyed by their own digest: a
  -- writer may add one only under its true digest, so nobody can plant a wrong body.
  IF to_regclass('public.fingerprints') IS NOT NULL THEN
    GRANT SELECT, INSERT, UPDATE, DELETE ON fingerprints TO artstore_gc;
    GRANT SELECT ON fingerprints TO artstore_reader;
    GRANT SELECT, INSERT ON fingerprints TO artstore_writer;
    ALTER TABLE fingerprints ENABLE ROW LEVEL SECURITY;
    DROP POLICY IF EXISTS artstore_gc ON fingerprints;
    CREATE POLICY artstore_gc ON fingerprints TO artstore_gc USING (true);
    DROP POLICY IF EXISTS artstore_namespace ON fingerprints;
    CREATE POLICY artstore_namespace ON fingerprints TO artstore_writer, artstore_reader
      USING (true)
      WITH CHECK (digest = encode(sha256(convert_to(body, 'UTF8')), 'hex'));
  END IF;
END
$$;

COMMIT;
