-- Roles for a team index in PostgreSQL. Run once per database as a superuser
-- (or the database owner), connected to the artstore database:
--
--   psql -v ON_ERROR_STOP=1 -d artstore -f infra/policies/postgres-roles.sql
--
-- Passwords are read from the environment with psql's \getenv (psql 15+), so
-- they never live in this file: ARTSTORE_ADMIN_PASSWORD, ARTSTORE_WRITER_PASSWORD,
-- ARTSTORE_READER_PASSWORD. Unset ones are left alone (e.g. when using
-- certificate or IAM authentication instead).
--
--   artstore_admin   owns the schema and runs `artstore db upgrade` (migrations).
--   artstore_writer  CI / warm jobs and writers: read and write rows, no DDL.
--   artstore_reader  workers with ARTSTORE_READ_ONLY=1: SELECT, plus INSERT on
--                    `accesses` only, where readers append their batched hits;
--                    `artstore gc` folds them into entries, so LRU sees the
--                    cluster's reads. Readers can never change entries or objects.
-- Safe to re-run (after migrations, it also grants on the tables they created).

\set ON_ERROR_STOP on

DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'artstore_admin') THEN
    CREATE ROLE artstore_admin LOGIN;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'artstore_writer') THEN
    CREATE ROLE artstore_writer LOGIN;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'artstore_reader') THEN
    CREATE ROLE artstore_reader LOGIN;
  END IF;
END
$$;

\getenv admin_password ARTSTORE_ADMIN_PASSWORD
\if :{?admin_password}
ALTER ROLE artstore_admin PASSWORD :'admin_password';
\endif
\getenv writer_password ARTSTORE_WRITER_PASSWORD
\if :{?writer_password}
ALTER ROLE artstore_writer PASSWORD :'writer_password';
\endif
\getenv reader_password ARTSTORE_READER_PASSWORD
\if :{?reader_password}
ALTER ROLE artstore_reader PASSWORD :'reader_password';
\endif

-- Only the three roles may connect; only the admin may create objects.
DO $$
BEGIN
  EXECUTE format('REVOKE ALL ON DATABASE %I FROM PUBLIC', current_database());
  EXECUTE format('GRANT CONNECT, TEMPORARY ON DATABASE %I TO artstore_admin', current_database());
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO artstore_writer, artstore_reader',
                 current_database());
END
$$;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE, CREATE ON SCHEMA public TO artstore_admin;
GRANT USAGE ON SCHEMA public TO artstore_writer, artstore_reader;

-- Tables that exist already (re-run after `artstore db upgrade`).
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO artstore_writer;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO artstore_writer;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO artstore_reader;

-- Tables and sequences that future migrations create as artstore_admin.
ALTER DEFAULT PRIVILEGES FOR ROLE artstore_admin IN SCHEMA public
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO artstore_writer;
ALTER DEFAULT PRIVILEGES FOR ROLE artstore_admin IN SCHEMA public
  GRANT USAGE, SELECT ON SEQUENCES TO artstore_writer;
ALTER DEFAULT PRIVILEGES FOR ROLE artstore_admin IN SCHEMA public
  GRANT SELECT ON TABLES TO artstore_reader;

-- Readers append their hits to `accesses` (created by migration 0002; re-run
-- this file after `artstore db upgrade` if it did not exist yet).
DO $$
BEGIN
  IF to_regclass('public.accesses') IS NOT NULL THEN
    GRANT INSERT ON accesses TO artstore_reader;
    GRANT USAGE ON SEQUENCE accesses_id_seq TO artstore_reader;
  END IF;
END
$$;
