"""Secrets never reach output (invariant 5; issue 15, item 5).

Known, unique secret values (an S3 session token and secret key, a database password
in a URL's user info and in its `?password=` parameter, an S3 endpoint's
`user:password@`, a signing key file's contents) are put where a user would put
them, and every failure path we know of is run as a real process: the `artstore`
commands against a refused and a misconfigured PostgreSQL, a malformed URL, S3 down,
a missing bucket and missing credentials on the moto server, bad signing key
settings; and a program calling `artifactstore.configure()` and jitting with the
package's logging at DEBUG. No secret may appear in stdout, stderr, a log file or
JSON output, and every command that fails says so in one line, without a traceback.

The redaction function itself is tested on a table at the end.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import FAKE_AWS, artstore, clean_env, devstack

from artifactstore.redact import redact, remember_secrets_in

TAG = uuid.uuid4().hex[:12]  # names (bucket, role, database); never part of a secret


def _unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:14]}Q"


SECRETS = {
    "session token": _unique("TOKsess"),
    "secret key": _unique("SECaws"),
    "password in user info": _unique("PWinfo"),
    "password in query": _unique("PWquery"),
    "endpoint password": _unique("EPWend"),
    "garbage key file": _unique("GARBkey"),
}
TIMEOUT = "2"


def leaks(text: str) -> list[str]:
    """Which secrets `text` shows, whole or in part (a message cut at 300 characters
    could end inside one)."""
    found = []
    for name, value in SECRETS.items():
        core = value[-15:]  # the unique part
        if value in text or core[:8] in text or core[-8:] in text:
            found.append(name)
    return found


@dataclass
class World:
    envs: dict[str, dict[str, str]]
    key_dir: Path
    moto: str
    closed: int


@pytest.fixture(scope="module")
def world(moto_endpoint: str, postgres: None, tmp_path_factory: pytest.TempPathFactory) -> World:
    from artifactstore.config.keyfiles import generate

    tmp = tmp_path_factory.mktemp("secrets")
    key_dir = tmp / "keys"
    key_dir.mkdir()
    secret_file, public_file = generate("ci", key_dir)
    SECRETS["signing key"] = secret_file.read_text().strip().split(":", 1)[1]
    bucket = "artstore-sec-" + TAG
    devstack.create_bucket(moto_endpoint, bucket)
    closed = devstack.free_port()  # nothing listens there
    moto_port = moto_endpoint.rsplit(":", 1)[1]
    info, query = SECRETS["password in user info"], SECRETS["password in query"]
    endpoint_pw = SECRETS["endpoint password"]

    def env(**extra: str) -> dict[str, str]:
        base = clean_env(
            **{
                **FAKE_AWS,
                "AWS_SECRET_ACCESS_KEY": SECRETS["secret key"],
                "AWS_SESSION_TOKEN": SECRETS["session token"],
            },
            ARTSTORE_TIMEOUT=TIMEOUT,
            ARTSTORE_BREAKER_COOLDOWN="1",
            ARTSTORE_LOCAL_TIER="off",
            ARTSTORE_SIGNING_KEY=str(secret_file),
            ARTSTORE_TRUSTED_KEYS=str(public_file),  # `artstore sign` needs them
            ARTSTORE_URL=f"s3://{bucket}/cache",
            ARTSTORE_S3_ENDPOINT_URL=f"http://artuser:{endpoint_pw}@127.0.0.1:{moto_port}",
        )
        base.pop("AWS_ENDPOINT_URL_S3", None)
        base.update(extra)
        return base

    sqlite = f"sqlite:///{tmp / 'index.db'}"
    s3_down = f"http://artuser:{endpoint_pw}@127.0.0.1:{closed}"
    envs = {
        # PostgreSQL refusing connections; passwords in user info and in the query.
        "pg refused": env(
            ARTSTORE_INDEX=f"postgresql+psycopg://artstore_writer:{info}@127.0.0.1:{closed}"
            f"/artstore?password={query}&sslmode=prefer"
        ),
        # The server answers, but the role (trust auth takes any password) or the
        # database does not exist.
        "pg no role": env(
            ARTSTORE_INDEX=f"postgresql+psycopg://nobody_{TAG}:{info}@127.0.0.1:5432/postgres"
        ),
        "pg no database": env(
            ARTSTORE_INDEX=f"postgresql+psycopg://postgres@127.0.0.1:5432/nodb_{TAG}"
            f"?password={query}"
        ),
        "malformed index URL": env(
            ARTSTORE_INDEX=f"postgresql+psycopg://u:{info}@127.0.0.1:notaport/db?password={query}"
        ),
        "token in store URL": env(
            ARTSTORE_URL=f"s3://{bucket}/cache?X-Amz-Security-Token={SECRETS['session token']}",
            ARTSTORE_INDEX=sqlite,
        ),
        "malformed endpoint": env(
            ARTSTORE_S3_ENDPOINT_URL=f"127.0.0.1:{moto_port}?password={query}",
            ARTSTORE_INDEX=sqlite,
        ),
        "s3 down": env(ARTSTORE_S3_ENDPOINT_URL=s3_down, ARTSTORE_INDEX=sqlite),
        "s3 no bucket": env(ARTSTORE_URL=f"s3://nobucket-{TAG}/cache", ARTSTORE_INDEX=sqlite),
        "s3 no access key": env(ARTSTORE_INDEX=sqlite, AWS_ACCESS_KEY_ID=""),
    }
    envs["s3 no access key"].pop("AWS_ACCESS_KEY_ID")
    return World(envs, key_dir, moto_endpoint, closed)


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, check=False)


def check_cli(
    case: str, args: tuple[str, ...], proc: subprocess.CompletedProcess[str], must_fail: bool
) -> list[str]:
    """What is wrong with one command's run: leaks, tracebacks, a failure not in one line."""
    what = f"{case}: artstore {' '.join(args)} (exit {proc.returncode})"
    out = proc.stdout + proc.stderr
    problems = [f"{what} shows the {name}:\n{out}" for name in leaks(out)]
    if "Traceback" in out:
        problems.append(f"{what} printed a traceback:\n{out}")
    if must_fail and proc.returncode == 0:
        problems.append(f"{what} succeeded:\n{out}")
    report = args[0] == "doctor" or args[:2] == ("db", "check")
    if report and proc.returncode in (0, 1) and not proc.stderr.strip():
        # A report: exit 1 when something is wrong, what (not an error line) on stdout.
        if "--json" in args:
            try:
                json.loads(proc.stdout)
            except ValueError:
                problems.append(f"{what}: --json printed no JSON:\n{out}")
    elif proc.returncode != 0:  # or one line on stderr saying why there is no report
        lines = proc.stderr.strip().splitlines()
        if len(lines) != 1 or not lines[0].startswith("artstore: error: "):
            problems.append(f"{what}: not a one-line error:\n{proc.stderr}")
    return problems


# (arguments, must fail) per scenario; doctor (which imports JAX) only a few times.
EVERY_COMMAND: list[tuple[tuple[str, ...], bool]] = [
    (("stats",), True),
    (("stats", "--json"), True),
    (("ls",), True),
    (("db", "upgrade"), True),
    (("db", "check"), True),
    (("db", "check", "--json"), True),
    (("verify",), True),
    (("gc", "--dry-run"), True),
    (("sign",), True),
]
CASES: dict[str, list[tuple[tuple[str, ...], bool]]] = {
    "pg refused": [*EVERY_COMMAND, (("doctor", "--json"), True)],
    "pg no role": [
        (("stats",), True),
        (("db", "upgrade"), True),
        (("verify",), True),
        (("db", "check", "--json"), True),
    ],
    "pg no database": [
        (("ls", "--json"), True),
        (("db", "upgrade"), True),
        (("gc", "--dry-run"), True),
        (("doctor",), True),
    ],
    "malformed index URL": [
        (("stats",), True),
        (("db", "upgrade"), True),
        (("db", "check", "--json"), True),
        (("sign",), True),
    ],
    "token in store URL": [(("stats",), True), (("ls",), True), (("doctor",), True)],
    "malformed endpoint": [(("stats",), True), (("verify",), True)],
    # The index (SQLite) answers: commands that need only the index may succeed.
    "s3 down": [
        (("stats",), False),
        (("verify",), True),
        (("gc", "--dry-run"), False),
        (("sign",), True),
        (("db", "check", "--json"), False),
        (("doctor", "--json"), True),
    ],
    "s3 no bucket": [(("verify", "--json"), True), (("gc", "--dry-run"), False), (("sign",), True)],
    "s3 no access key": [
        (("verify",), True),
        (("gc", "--dry-run", "--json"), False),
        (("sign", "--json"), True),
    ],
}


@pytest.mark.parametrize("case", list(CASES))
def test_cli_failures_never_show_secrets(case: str, world: World) -> None:
    env = world.envs[case]
    commands = CASES[case]
    with ThreadPoolExecutor(max_workers=4) as pool:
        procs = list(pool.map(lambda c: artstore(*c[0], env=env), commands))
    problems = [
        p
        for (args, must_fail), proc in zip(commands, procs, strict=True)
        for p in check_cli(case, args, proc, must_fail)
    ]
    assert not problems, "\n\n".join(problems)


def _key_settings(key_dir: Path) -> dict[str, tuple[str, str]]:
    """Bad ARTSTORE_SIGNING_KEY values -> (value, what the one-line error must say)."""
    secret_file, public_file = key_dir / "ci.key", key_dir / "ci.pub"
    loose = key_dir / "loose.key"
    if not loose.exists():
        shutil.copy(secret_file, loose)
        loose.chmod(0o644)
    garbage = key_dir / "garbage.key"
    if not garbage.exists():
        garbage.write_text(f"ci:{SECRETS['garbage key file']}\nsecond line\n")
        garbage.chmod(0o600)
    text = secret_file.read_text().strip()
    return {
        "readable by others": (str(loose), "chmod 600"),
        "not a key": (str(garbage), "is not an artifactstore/Nix secret key"),
        "public key": (str(public_file), "is a public key"),
        "key inline": (text, "not the key itself"),
        "seed inline": (text.split(":", 1)[1], "not the key itself"),
        "missing": (str(key_dir / "missing.key"), "cannot read signing key file"),
    }


def test_bad_signing_keys_are_one_line_errors_without_contents(
    world: World, tmp_path: Path
) -> None:
    settings = _key_settings(world.key_dir)
    commands = (("stats",), ("sign",))
    runs = [
        (name, commands[n % 2], value, says)
        for n, (name, (value, says)) in enumerate(settings.items())
    ]
    store = str(tmp_path / "store")

    def one(item: tuple[str, tuple[str, ...], str, str]) -> subprocess.CompletedProcess[str]:
        _, command, value, _ = item
        env = clean_env(ARTSTORE_URL=store, ARTSTORE_SIGNING_KEY=value, ARTSTORE_TIMEOUT=TIMEOUT)
        return artstore(*command, env=env)

    with ThreadPoolExecutor(max_workers=4) as pool:
        procs = list(pool.map(one, runs))
    problems = []
    for (name, command, value, says), proc in zip(runs, procs, strict=True):
        problems += check_cli(f"signing key {name}", command, proc, must_fail=True)
        if says not in proc.stderr:
            problems.append(f"signing key {name}: {says!r} not in {proc.stderr!r}")
        if "inline" not in name and value not in proc.stderr:  # names the file to fix
            problems.append(f"signing key {name}: the path is not named: {proc.stderr!r}")
    assert not problems, "\n\n".join(problems)


PROGRAM = r"""
import json, logging, os, sys, traceback

log_file = sys.argv[1]
fmt = logging.Formatter("%(levelname)s %(name)s %(message)s")
for handler in (logging.FileHandler(log_file), logging.StreamHandler(sys.stderr)):
    handler.setFormatter(fmt)
    logging.getLogger().addHandler(handler)
logging.getLogger().setLevel(logging.WARNING)
logging.getLogger("artifactstore").setLevel(logging.DEBUG)

import jax, jax.numpy as jnp
import artifactstore

plan = json.loads(os.environ["SECRETS_PLAN"])
# Mistakes in the program's own call raise at once: the traceback a user sees.
for kwargs in plan["bad_calls"]:
    try:
        artifactstore.configure(**kwargs)
    except artifactstore.ArtstoreError:
        traceback.print_exc()
    else:
        print("configure() accepted " + ", ".join(kwargs), file=sys.stderr)
# A bad ARTSTORE_* variable: one warning, compiles as usual.
os.environ.update(plan["bad_env"])
artifactstore.configure()
for name in plan["bad_env"]:
    del os.environ[name]
# Configurations whose backends fail: lookups and uploads fail, logged.
for n, kwargs in enumerate(plan["runs"]):
    artifactstore.configure(**kwargs)
    f = jax.jit(lambda x, n=n: jnp.sin(x) * (n + 2) + 1)
    f(jnp.arange(8.0)).block_until_ready()
    artifactstore.flush(10)
    logging.getLogger("artifactstore").debug("stats %s", artifactstore.process_stats())
    artifactstore.deactivate()
print(json.dumps({"done": True}))
"""


def test_configure_and_jit_never_log_secrets(world: World, tmp_path: Path) -> None:
    """configure() errors, a bad environment variable and failing backends, with the
    package's logger at DEBUG into a file and stderr: no secret anywhere."""
    base = world.envs["pg refused"]
    settings = _key_settings(world.key_dir)
    sqlite = f"sqlite:///{tmp_path / 'index.db'}"
    endpoint = base["ARTSTORE_S3_ENDPOINT_URL"]
    s3_down = world.envs["s3 down"]["ARTSTORE_S3_ENDPOINT_URL"]
    common = {"timeout_secs": 2, "min_compile_secs": 0, "local_tier": "off"}
    plan = {
        "bad_calls": [
            {"index": world.envs["malformed index URL"]["ARTSTORE_INDEX"]},
            {"url": world.envs["token in store URL"]["ARTSTORE_URL"], "index": sqlite},
            {
                "url": base["ARTSTORE_URL"],
                "index": sqlite,
                "s3_endpoint_url": world.envs["malformed endpoint"]["ARTSTORE_S3_ENDPOINT_URL"],
            },
            *({"url": str(tmp_path / "s"), "signing_key": value} for value, _ in settings.values()),
        ],
        "bad_env": {"ARTSTORE_INDEX": world.envs["malformed index URL"]["ARTSTORE_INDEX"]},
        "runs": [
            {"index": base["ARTSTORE_INDEX"], **common},  # PG refused
            {"index": world.envs["pg no database"]["ARTSTORE_INDEX"], **common},
            {"index": sqlite, "s3_endpoint_url": s3_down, **common},  # uploads fail
            {"index": sqlite, "s3_endpoint_url": endpoint, **common},  # works
        ],
    }
    env = {k: v for k, v in base.items() if k not in ("ARTSTORE_INDEX",)}
    env["SECRETS_PLAN"] = json.dumps(plan)
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    log_file = tmp_path / "artifactstore.log"
    proc = run([sys.executable, str(program), str(log_file)], env)
    log = log_file.read_text() if log_file.exists() else ""
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "configure() accepted" not in proc.stderr, proc.stderr
    assert proc.stderr.count("Traceback") == len(plan["bad_calls"]), proc.stderr
    assert "artifactstore" in log and "stats" in log  # the log was written, at DEBUG
    for where, text in (("stdout", proc.stdout), ("stderr", proc.stderr), ("log", log)):
        assert not leaks(text), f"{where} shows the {leaks(text)}:\n{text}"


# -- the redaction function ------------------------------------------------------

REDACTIONS = [
    ("postgresql+psycopg://u:hunter2@db:5432/artstore",
     "postgresql+psycopg://u:***@db:5432/artstore"),
    ("postgresql+psycopg://u@db/artstore?password=hunter2&sslmode=verify-full",
     "postgresql+psycopg://u@db/artstore?password=***&sslmode=verify-full"),
    ("postgresql://u@db/a?sslpassword=p1&sslkey=/k/client.key&passfile=/h/.pgpass",
     "postgresql://u@db/a?sslpassword=***&sslkey=/k/client.key&passfile=/h/.pgpass"),
    ("s3://b/p?X-Amz-Security-Token=FQo%2Fx&X-Amz-Signature=ab12&X-Amz-Credential=AK%2F1&v=2",
     "s3://b/p?X-Amz-Security-Token=***&X-Amz-Signature=***&X-Amz-Credential=***&v=2"),
    ("S3 bucket 'b' not reachable at http://minio:minio123@10.0.0.1:9000 (EndpointConnectionError)",
     "S3 bucket 'b' not reachable at http://minio:***@10.0.0.1:9000 (EndpointConnectionError)"),
    ("malformed store URL 's3://b/p?x-amz-security-token=abc': use s3://bucket/prefix",
     "malformed store URL 's3://b/p?x-amz-security-token=***': use s3://bucket/prefix"),
    ("host=db port=5432 dbname=a user=u password='two words' sslmode=require",
     "host=db port=5432 dbname=a user=u password=*** sslmode=require"),
    ("host=db password = abc user=u", "host=db password = *** user=u"),
    ("AWS_SECRET_ACCESS_KEY=wJal/K7+bP AWS_SESSION_TOKEN=IQo= AWS_REGION=us-east-1",
     "AWS_SECRET_ACCESS_KEY=*** AWS_SESSION_TOKEN=*** AWS_REGION=us-east-1"),
    ("db_password=x client_secret=y refresh_token=z", "db_password=*** client_secret=*** "
     "refresh_token=***"),
    ("http://u:p@ss@h/x", "http://u:***@h/x"),  # a raw '@' in the password
    ("<URL password=x>", "<URL password=***>"),
    # Kept: no secret in them.
    ("postgresql+psycopg://u:***@db/artstore", "postgresql+psycopg://u:***@db/artstore"),
    ("postgresql+psycopg://artstore_writer@db.internal:5432/artstore",
     "postgresql+psycopg://artstore_writer@db.internal:5432/artstore"),
    ('connection to server at "127.0.0.1", port 1 failed: Connection refused',
     'connection to server at "127.0.0.1", port 1 failed: Connection refused'),
    ("bad_signature=3 unsigned=2 signatures_checked=True",
     "bad_signature=3 unsigned=2 signatures_checked=True"),
    ("https://s3.us-east-1.amazonaws.com/bucket?list-type=2&prefix=cache",
     "https://s3.us-east-1.amazonaws.com/bucket?list-type=2&prefix=cache"),
    ("token: 5 (ExpiredToken)", "token: 5 (ExpiredToken)"),
    ("", ""),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), REDACTIONS)
def test_redact(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert redact(expected) == expected  # idempotent


def test_redact_masks_known_values_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Values of secret environment variables and of passwords in configured URLs are
    masked in any shape a driver may quote them (here, a libpq parse error)."""
    monkeypatch.setenv("PGPASSWORD", "pg-env-secret")
    assert redact('missing "=" after "pg-env-secret" in conninfo') == (
        'missing "=" after "***" in conninfo'
    )
    remember_secrets_in("postgresql://u:p%40ss-remembered@h/db?sslpassword=ssl-remembered")
    assert redact("x p@ss-remembered y ssl-remembered") == "x *** y ***"


def test_errors_and_log_records_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from artifactstore.errors import ConfigError, one_line

    url = "postgresql://u:pw-in-error@h/db?password=pw-in-query"
    assert "pw-in" not in str(ConfigError(f"bad URL {url!r}"))
    assert "pw-in" not in one_line(RuntimeError(f"driver says {url}\nsecond line"))
    with caplog.at_level(logging.DEBUG, logger="artifactstore"):
        logging.getLogger("artifactstore").warning("cannot open %s", url)
        try:
            raise ValueError(url)
        except ValueError:
            logging.getLogger("artifactstore").exception("failed")
    assert "pw-in" not in caplog.text and "u:***@h" in caplog.text
    # configure() returns the settings: printing them shows no password either.
    from artifactstore import config

    settings = config.resolve({"url": "/tmp/s", "index": url}, {})
    assert "pw-in" not in repr(settings) and "pw-in-error" in settings.index_url


def test_signing_key_file_readers_are_one_helper(tmp_path: Path) -> None:
    """Secret and public key files are read by the same code (one place to keep
    contents out of messages); a .pub is not a signing key, a .key not a trusted key."""
    from artifactstore.config import keyfiles
    from artifactstore.errors import ConfigError

    secret_file, public_file = keyfiles.generate("one", tmp_path)
    assert keyfiles.load_signing_key(secret_file).name == "one"
    assert keyfiles.load_trusted_keys(str(public_file)).names == ["one"]
    seed = secret_file.read_text().split(":", 1)[1].strip()
    for value in (str(public_file), seed):
        with pytest.raises(ConfigError) as err:
            keyfiles.load_signing_key(value)
        assert seed not in str(err.value)
    with pytest.raises(ConfigError) as err:
        keyfiles.load_trusted_keys(base64.b64encode(os.urandom(48)).decode())
    assert "not echoed" in str(err.value)
