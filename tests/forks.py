"""How `conftest.artstore`, `conftest.run_program` and `conftest.start_program` start a
process (`run`: to its end, as subprocess.run; `popen`: running, as subprocess.Popen):
forked by tests/fork_server.py, or, where that would not be the same, a fresh interpreter.

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
import io
import json
import locale
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

SERVER = Path(__file__).resolve().parent / "fork_server.py"
# Read as an interpreter, JAX or artifactstore_startup (the .pth) start: a call must agree
# with its server on these, and on every ARTSTORE_* name unless ARTSTORE_ACTIVATE=0 (the hook
# reads ARTSTORE_URL and _WARM, and where neither turns the store on, says a typo in any).
START_PREFIXES = ("PYTHON", "JAX_", "XLA_", "TF_", "TPU_", "LD_", "OMP_", "OPENBLAS_", "MKL_")
START_NAMES = ("ARTSTORE_ACTIVATE", "ARTSTORE_URL", "ARTSTORE_WARM", "MALLOC_ARENA_MAX")
# What JAX writes into the environment itself: `import jax` sets the first unless it is set
# (the server's children get it as a fresh import would), the backend's start the second
# (in the child): once a test's process imported JAX, its environments carry both.
JAX_SETS = {"TF_CPP_MIN_LOG_LEVEL": "1", "TPU_SKIP_MDS_QUERY": "1"}
_servers: dict[str, tuple[int, str | None, dict[str, str]]] = {}  # kind -> pid, socket, env
# The environment servers start with (conftest sets the suite's plain one), not whichever
# call comes first: one that activates the store or sets PYTHONPATH would make every
# later call disagree, and run fresh.
BASE: dict[str, str] = {}
_starting = threading.Lock()
CLI = {"module": "artifactstore"}  # the target of `python -m artifactstore`


def _at_start(kind: str, env: dict[str, str]) -> dict[str, str]:
    """What of `env` a process of `kind` reads as it starts: the CLI, only Python's own
    variables (it turns the start-up hook off, and imports JAX, where it does, after)."""
    if kind == "cli":
        return {k: v for k, v in env.items() if k.startswith("PYTHON")}
    names, prefixes = START_NAMES, (*START_PREFIXES, "ARTSTORE_")
    if env.get("ARTSTORE_ACTIVATE") == "0":
        names, prefixes = ("ARTSTORE_ACTIVATE",), START_PREFIXES
    env = {**JAX_SETS, **env}
    return {k: v for k, v in env.items() if k.startswith(prefixes) or k in names}


def _server(kind: str, env: dict[str, str]) -> str | None:
    """The socket of this process's `kind` server (started on first use, with BASE or
    else `env`), if it runs and `env` agrees with its own on what is read at start-up."""
    with _starting:  # tests call from threads too: one server per kind
        known = _servers.get(kind)
        if known is None or known[0] != os.getpid():
            started = BASE or env
            known = (os.getpid(), _start(kind, started), started)
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
    input: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` ({"module": MODULE}) or `python PATH ARGS` ({"path": PATH}),
    forked from the `kind` server where that is the same, else (or if `fresh`) in a fresh
    interpreter; its output captured as text, as subprocess.run would (`input` on its
    stdin, else none), in `cwd` (else this one)."""
    done = None if fresh else forked(kind, target, args, env, timeout, input, cwd)
    if done is not None:
        return done
    return subprocess.run(
        _fresh(target, args),
        env=env,
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def forked(
    kind: str,
    target: dict[str, str],
    args: list[str],
    env: dict[str, str],
    timeout: float,
    input: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str] | None:
    """Run {"module": M} or {"path": P} with `args` in a forked process, its output
    captured as subprocess.run(capture_output=True, text=True) would; None where it must
    run in a fresh interpreter."""
    stdin = subprocess.DEVNULL if input is None else subprocess.PIPE
    how = (stdin, subprocess.PIPE, subprocess.PIPE)
    proc = _spawn(kind, target, args, env, how, False, cwd)
    if proc is None:
        return None
    try:
        data = None if input is None else input.encode(locale.getpreferredencoding(False))
        out, err = proc.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:  # as subprocess.run: killed, then raised
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.wait(), _text(out), _text(err))


class Forked:
    """A forked process with subprocess.Popen's face (pid, stdin, stdout, stderr, poll,
    wait, communicate, send_signal, kill), for tests that talk to a running program; its
    wait status comes from the server, whose child it is."""

    def __init__(
        self, argv: list[str], pid: int, answer: socket.socket, streams: dict[int, int], text: bool
    ) -> None:
        self.args = argv
        self.pid = pid
        self.returncode: int | None = None
        self._answer = answer
        self._status = b""
        opened: list[Any] = []
        for fd, mode in ((streams.get(0), "wb"), (streams.get(1), "rb"), (streams.get(2), "rb")):
            if fd is None:
                opened.append(None)
            elif text and mode == "wb":  # as Popen(text=True) wraps them
                raw = open(fd, mode)
                opened.append(io.TextIOWrapper(raw, write_through=True))
            elif text:
                opened.append(io.TextIOWrapper(open(fd, mode)))
            else:
                opened.append(open(fd, mode))
        self.stdin, self.stdout, self.stderr = opened

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *_: object) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.wait()

    def _collect(self, timeout: float | None) -> bool:
        """Read the wait status if it comes within `timeout` (None: however long)."""
        if self.returncode is not None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._status.endswith(b"\n"):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._answer], [], [], left)
            if not ready:
                return False
            chunk = self._answer.recv(64)
            if not chunk:  # the server is gone: as if killed
                self._status += b"\n"
                break
            self._status += chunk
        self._answer.close()
        status = self._status.strip()
        self.returncode = os.waitstatus_to_exitcode(int(status)) if status else -signal.SIGKILL
        return True

    def poll(self) -> int | None:
        self._collect(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._collect(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not once the server has reaped it: its pid may be reused
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        """As Popen.communicate: `input` written and stdin closed, stdout and stderr read to
        their end, then the exit waited for; TimeoutExpired past `timeout`."""
        if self.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                if input:
                    self.stdin.write(input)
                self.stdin.close()
        got: dict[str, Any] = {}
        readers = [
            threading.Thread(target=lambda n=name, s=stream: got.__setitem__(n, s.read()))
            for name, stream in (("out", self.stdout), ("err", self.stderr))
            if stream is not None
        ]
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in readers:
            thread.daemon = True
            thread.start()
        for thread in readers:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(left)
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        return got.get("out"), got.get("err")


Process = Forked | subprocess.Popen[Any]


def popen(
    kind: str,
    target: dict[str, str],
    args: list[str],
    env: dict[str, str],
    *,
    fresh: bool = False,
    stdin: int | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
    text: bool = True,
    cwd: str | os.PathLike[str] | None = None,
) -> Process:
    """Start `python -m MODULE ARGS` or `python PATH ARGS` as subprocess.Popen would
    (stdin/stdout/stderr: subprocess.PIPE, DEVNULL, a descriptor, or None to share the
    caller's), forked from the `kind` server where that is the same, else fresh."""
    how = (stdin, stdout, stderr)
    started = None if fresh else _spawn(kind, target, args, env, how, text, cwd)
    if started is not None:
        return started
    return subprocess.Popen(
        _fresh(target, args),
        env=env, stdin=stdin, stdout=stdout, stderr=stderr, text=text, cwd=cwd,
    )  # fmt: skip


def _spawn(
    kind: str,
    target: dict[str, str],
    args: list[str],
    env: dict[str, str],
    how: tuple[int | None, int | None, int | None],
    text: bool,
    cwd: str | os.PathLike[str] | None = None,
) -> Forked | None:
    if os.environ.get("ARTSTORE_TEST_FRESH") == "1":
        return None
    path = _server(kind, env)
    if path is None:
        return None
    theirs: list[int] = []
    ours: dict[int, int] = {}
    for number, spec in enumerate(how):
        if spec == subprocess.PIPE:
            read, write = os.pipe()
            theirs.append(read if number == 0 else write)
            ours[number] = write if number == 0 else read
        elif spec == subprocess.DEVNULL:
            theirs.append(os.open(os.devnull, os.O_RDONLY if number == 0 else os.O_WRONLY))
        else:
            theirs.append(os.dup(number if spec is None else spec))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        body = json.dumps(
            {**target, "args": args, "env": env, "cwd": os.fspath(cwd or os.getcwd())}
        ).encode()
        socket.send_fds(sock, [struct.pack("!Q", len(body))], theirs)
        sock.sendall(body)
        pid = int(sock.makefile("rb", buffering=0).readline())
    except (OSError, ValueError):
        sock.close()
        for fd in ours.values():
            os.close(fd)
        return None
    finally:
        for fd in theirs:  # the child's now (or nobody's)
            os.close(fd)
    return Forked([target.get("module") or target["path"], *args], pid, sock, ours, text)


def _fresh(target: dict[str, str], args: list[str]) -> list[str]:
    """The command line of a fresh interpreter running `target` with `args`."""
    where = ["-m", target["module"]] if "module" in target else [target["path"]]
    return [sys.executable, *where, *args]


def _text(data: bytes) -> str:
    """As subprocess.run(text=True) decodes: the locale's encoding, universal newlines."""
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")
