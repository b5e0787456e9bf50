"""The one place secrets are taken out of text before anyone sees it (invariant 5).

Messages quote URLs and settings so that a person can see what is wrong, and URLs
carry secrets: `postgresql://user:PASSWORD@host/db`, `?password=` or `sslpassword=`
query parameters, an S3 endpoint's `user:password@`, a presigned URL's
`X-Amz-Security-Token`, `X-Amz-Signature`, `X-Amz-Credential`, and the text of
libpq, psycopg and botocore errors that repeat them. `redact` replaces each such
value with `***` and keeps the rest (scheme, user, host, port, database, bucket,
prefix) readable, so the message still says where it went wrong.

It works on any text, not on parsed URLs, because most of what needs it is free-form
(exception text, log lines), and a parser that rejects a malformed URL is exactly
when the URL is quoted. On top of the patterns it masks the literal values of secrets
this process knows: those of AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN and PGPASSWORD,
and every password `remember_secrets_in` found in a configured URL, so that a driver
message quoting a password in a shape no pattern knows is still masked.

Paths are not secrets: `sslkey`, `sslcert`, `passfile` and signing key paths stay
readable (they say which file to fix); what is in those files is never read into a
message in the first place.

Every way out goes through here: `errors.ArtstoreError` (its message, at creation),
`errors.one_line` (any other exception quoted in a message), the CLI's error line and
its printed values, and a filter on the `artifactstore` logger (`install_log_filter`).
This module imports nothing from the package, so every layer can use it.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from urllib.parse import parse_qsl, unquote, urlsplit

MASK = "***"

# Names (lowercase, '-' as '_') whose values are secret in a query string, a libpq
# conninfo string, an environment listing or a repr: exact names, then endings.
_SECRET_NAMES = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "pass",
        "sslpassword",
        "pgpassword",
        "secret",
        "client_secret",
        "secret_key",
        "secretkey",
        "private_key",
        "api_key",
        "apikey",
        "token",
        "access_token",
        "refresh_token",
        "auth_token",
        "id_token",
        "session_token",
        "sessiontoken",
        "security_token",
        "x_amz_security_token",
        "x_amz_signature",
        "x_amz_credential",
        "signature",
        "sig",
        "x_goog_signature",
        "x_goog_credential",
        "aws_secret_access_key",
        "aws_session_token",
        "aws_security_token",
    }
)
_SECRET_ENDINGS = re.compile(r"(password|passwd|secret|_token|secret_access_key)$")

# `scheme://user:PASSWORD@host`: the password runs to the last '@' before the URL ends
# (a raw '@' or '/' in a password must not leave its tail readable).
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:'\"<>]*:)[^\s'\"<>]*@")
# `NAME=VALUE` (query parameter, conninfo keyword, environment variable, repr field),
# VALUE quoted or running to whitespace, '&', a quote or '>'.
_ASSIGNMENT = re.compile(
    r"(?P<name>(?<![A-Za-z0-9_.-])[A-Za-z][A-Za-z0-9_.-]*)(?P<eq>\s*=\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|[^\s&'\"<>]*)"
)
# Secrets in the environment of this process, masked wherever their values appear.
SECRET_ENV_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "PGPASSWORD")
_MIN_LITERAL = 8  # shorter values would mask ordinary words; the patterns still catch them

_known: set[str] = set()
_known_lock = threading.Lock()


def is_secret_name(name: str) -> bool:
    """Whether a parameter, keyword or variable called `name` holds a secret."""
    norm = name.lower().replace("-", "_")
    return norm in _SECRET_NAMES or _SECRET_ENDINGS.search(norm) is not None


def redact(text: str) -> str:
    """`text` with every secret it quotes replaced by `***`, everything else kept."""
    if not text:
        return text
    text = _USERINFO.sub(lambda m: m.group("head") + MASK + "@", text)
    text = _ASSIGNMENT.sub(_mask_assignment, text)
    for secret in _literals():
        text = text.replace(secret, MASK)
    return text


def _mask_assignment(match: re.Match[str]) -> str:
    if not is_secret_name(match.group("name")) or match.group("value") in ("", MASK):
        return match.group(0)
    return match.group("name") + match.group("eq") + MASK


def _literals() -> list[str]:
    """Known secret values, longest first (so that no part of one is left behind)."""
    found = {os.environ.get(name, "") for name in SECRET_ENV_VARS}
    with _known_lock:
        found |= _known
    return sorted((s for s in found if len(s) >= _MIN_LITERAL), key=len, reverse=True)


def remember_secrets_in(url: str) -> None:
    """Mask, from now on in this process, the passwords and secret parameters of `url`
    (the configured index URL and S3 endpoint), in every shape a driver may quote them:
    as written, percent-decoded and percent-encoded."""
    try:
        parts = urlsplit(url)
        values = [parts.password or ""]
        query = parse_qsl(parts.query, keep_blank_values=True)
        values += [value for name, value in query if is_secret_name(name)]
    except ValueError:  # a malformed URL: take what the patterns see
        values = []
    for m in _USERINFO.finditer(url):
        values.append(m.group(0)[len(m.group("head")) : -1])
    for m in _ASSIGNMENT.finditer(url):
        if is_secret_name(m.group("name")):
            values.append(m.group("value").strip("'\""))
    shapes = {s for v in values for s in (v, unquote(v))}
    with _known_lock:
        _known.update(s for s in shapes if len(s) >= _MIN_LITERAL)


class RedactingFilter(logging.Filter):
    """Redacts each record's finished message (and traceback text) before any handler
    formats it: one place for every log line of the package, whatever its arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: let logging report it as usual
            return True
        record.msg, record.args = redact(message), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def install_log_filter(logger_name: str = "artifactstore") -> None:
    """Attach `RedactingFilter` to the package's logger once (every module logs
    through that one logger, never a child, so no record passes around it)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, RedactingFilter) for f in logger.filters):
        logger.addFilter(RedactingFilter())
