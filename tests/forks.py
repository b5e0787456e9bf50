"""How `conftest.artstore` and `conftest.run_program` start a process: forked by
tests/fork_server.py, or, where that would not be the same, a fresh interpreter.

A fresh `python -m artifactstore` spends about a second of CPU starting and importing
before it does anything, a JAX program more; the suite starts thousands, on CI's 2 cores.
Forked from a server that already imported what they import, each is still a process of
its own (pid, exit status, stdio, environment, exit path), started in a fraction of that.
A fresh interpreter instead: for a call whose environment differs from the server's in a
variable read while Python, JAX or artifactstore's start-up hook start (`_at_start`),
for any call where the server cannot start, and for every call with
ARTSTORE_TEST_FRESH=1 in the tests' environment.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERVER = Path(__file__).resolve().parent / "fork_server.py"
# Read as an interpreter, JAX or artifactstore_startup (the .pth) start: a call must agree
# with its server on these; ARTSTORE_URL and _WARM too unless ARTSTORE_ACTIVATE=0.
START_PREFIXES = ("PYTHON", "JAX_", "XLA_", "TF_", "TPU_", "LD_", "OMP_", "OPENBLAS_", "MKL_")
START_NAMES = ("ARTSTORE_ACTIVATE", "ARTSTORE_URL", "ARTSTORE_WARM", "MALLOC_ARENA_MAX")
_servers: dict[str, tuple[int, str | None, dict[str, str]]] = {}  # kind -> pid, socket, env


def _at_start(kind: str, env: dict[str, str]) -> dict[str, str]:
    """What of `env` a process of `kind` reads as it starts: the CLI, only Python's own
    variables (it turns the start-up hook off, and imports JAX, where it does, after)."""
    if kind == "cli":
        return {k: v for k, v in env.items() if k.startswith("PYTHON")}
    names = START_NAMES if env.get("ARTSTORE_ACTIVATE") != "0" else ("ARTSTORE_ACTIVATE",)
    return {k: v for k, v in env.items() if k.startswith(START_PREFIXES) or k in names}


def _server(kind: str, env: dict[str, str]) -> str | None:
    """The socket of this process's `kind` server (started on first use with `env`), if
    it runs and `env` agrees with its own on what is read at start-up."""
    known = _servers.get(kind)
    if known is None or known[0] != os.getpid():
        known = (os.getpid(), _start(kind, env), env)
        _servers[kind] = known
    _, path, started = known
    agrees = _at_start(kind, env) == _at_start(kind, started)
    return path if path is not None and agrees else None


def _start(kind: str, env: dict[str, str]) -> str | None:
    folder = tempfile.mkdtemp(prefix="artstore-forks-")
    path = os.path.join(folder, "sock")
    code = f"exec(compile(open({str(SERVER)!r}).read(), {str(SERVER)!r}, 'exec'))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, path, kind],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # a signal to a test's process group never reaches it
    )
    atexit.register(_stop, proc, folder)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if os.path.exists(path):
            return path
        time.sleep(0.02)
    return None


def _stop(proc: subprocess.Popen[bytes], folder: str) -> None:
    proc.kill()
    proc.wait()
    shutil.rmtree(folder, ignore_errors=True)


def run(
    kind: str,
    target: dict[str, str],
    args: list[str],
    env: dict[str, str],
    timeout: float,
    *,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` ({"module": MODULE}) or `python PATH ARGS` ({"path": PATH}),
    forked from the `kind` server where that is the same, else (or if `fresh`) in a fresh
    interpreter; its output captured as text, as subprocess.run would."""
    done = None if fresh else forked(kind, target, args, env, timeout)
    if done is not None:
        return done
    where = ["-m", target["module"]] if "module" in target else [target["path"]]
    return subprocess.run(
        [sys.executable, *where, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def forked(
    kind: str, target: dict[str, str], args: list[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str] | None:
    """Run {"module": M} or {"path": P} with `args` in a forked process, its output
    captured as subprocess.run(capture_output=True, text=True) would; None where it must
    run in a fresh interpreter."""
    if os.environ.get("ARTSTORE_TEST_FRESH") == "1":
        return None
    path = _server(kind, env)
    if path is None:
        return None
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    stdin = os.open(os.devnull, os.O_RDONLY)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        request = {**target, "args": args, "env": env, "cwd": os.getcwd()}
        body = json.dumps(request).encode()
        socket.send_fds(sock, [struct.pack("!Q", len(body))], [stdin, out_w, err_w])
        sock.sendall(body)
    except OSError:
        sock.close()
        for fd in (out_r, out_w, err_r, err_w, stdin):
            os.close(fd)
        return None
    for fd in (out_w, err_w, stdin):
        os.close(fd)
    answer = sock.makefile("rb")
    pid = int(answer.readline())
    argv = [target.get("module") or target["path"], *args]
    outputs = _read_both(out_r, err_r, time.monotonic() + timeout)
    if outputs is None:  # as subprocess.run: the process is killed, then TimeoutExpired
        with contextlib.suppress(ProcessLookupError):  # it exited; a grandchild holds a pipe
            os.kill(pid, signal.SIGKILL)
        answer.readline()
        sock.close()
        raise subprocess.TimeoutExpired(argv, timeout)
    status = answer.readline()
    sock.close()
    code = os.waitstatus_to_exitcode(int(status)) if status.strip() else -signal.SIGKILL
    return subprocess.CompletedProcess(argv, code, *outputs)


def _read_both(out: int, err: int, deadline: float) -> tuple[str, str] | None:
    """Both pipes read to their end (None past the deadline), as text."""
    got = {out: b"", err: b""}
    try:
        with selectors.DefaultSelector() as sel:
            for fd in got:
                sel.register(fd, selectors.EVENT_READ)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                for key, _ in sel.select(min(left, 1.0)):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        got[key.fd] += chunk
                    else:
                        sel.unregister(key.fd)
    finally:
        for fd in got:
            os.close(fd)
    return _text(got[out]), _text(got[err])


def _text(data: bytes) -> str:
    """As subprocess.run(text=True) decodes: the locale's encoding, universal newlines."""
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")
