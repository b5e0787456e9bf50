-- Let a login read (reader) or read and write (writer) one namespace of the index:
--
--   psql -v ON_ERROR_STOP=1 -d artstore -v namespace=team-a -v role=team_a_writer \
--        -f infra/policies/grant-namespace.sql
--
-- Creates the NOLOGIN role artstore_ns_<namespace> if it does not exist and makes
-- `role` a member; the row-level security policies of postgres-roles.sql let
-- members of artstore_writer / artstore_reader act only in namespaces whose role
-- they are members of. namespace='*' grants artstore_all_namespaces instead (every
-- namespace: a single team, or a deployment that has not granted namespaces yet).
-- Roles are cluster-wide: a grant holds in every database of the cluster. No schema
-- change is needed for a new namespace. Run as a superuser (or a CREATEROLE role).
--
-- To take a namespace away:  REVOKE "artstore_ns_team-a" FROM team_a_writer;
-- To see who has which:      \du artstore_ns_*

\set ON_ERROR_STOP on
-- Both variables are required: without one, fail (exit 3) naming it, so that a script
-- never goes on as if the login had been granted.
\if :{?namespace}
  \if :{?role}
  \else
    \set artstore_missing '-v role=LOGIN'
  \endif
\elif :{?role}
  \set artstore_missing '-v namespace=NAMESPACE'
\else
  \set artstore_missing '-v namespace=NAMESPACE and -v role=LOGIN'
\endif
\if :{?artstore_missing}
  \set VERBOSITY terse
  SELECT set_config('artstore.grant_missing', :'artstore_missing', false) \g /dev/null
  DO $$
  BEGIN
    RAISE EXCEPTION 'grant-namespace.sql needs %: usage: psql -v ON_ERROR_STOP=1 -d DATABASE '
                    '-v namespace=NAMESPACE -v role=LOGIN -f grant-namespace.sql',
                    current_setting('artstore.grant_missing');
  END
  $$;
\endif

-- psql variables do not reach into a DO block: pass them as settings of this session.
SELECT set_config('artstore.grant_namespace', :'namespace', false),
       set_config('artstore.grant_role', :'role', false) \g /dev/null

DO $$
DECLARE
  ns text := current_setting('artstore.grant_namespace');
  login text := current_setting('artstore.grant_role');
  ns_role text;
BEGIN
  IF ns = '*' THEN
    ns_role := 'artstore_all_namespaces';
  ELSIF ns !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,50}$' THEN
    -- artifactstore's namespace rule, less the 12 characters of the prefix.
    RAISE EXCEPTION 'invalid namespace %: 1-51 letters, digits, ., _ or -, starting with '
                    'a letter or digit', quote_literal(ns);
  ELSE
    ns_role := 'artstore_ns_' || ns;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = login) THEN
    RAISE EXCEPTION 'no role %: create the login first, e.g. CREATE ROLE % LOGIN IN ROLE '
                    'artstore_writer', quote_ident(login), quote_ident(login);
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = ns_role) THEN
    BEGIN
      EXECUTE format('CREATE ROLE %I NOLOGIN', ns_role);
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
      NULL;  -- created meanwhile by another grant
    END;
  END IF;
  IF NOT pg_has_role(login, ns_role, 'MEMBER') THEN
    EXECUTE format('GRANT %I TO %I', ns_role, login);
  END IF;
END
$$;
