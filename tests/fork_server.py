"""A fork server for the processes the tests start: the CLI, and the JAX test programs.

The tests run every command and program in its own process, as a user would: exit
status, stdout, stderr, the environment and the exit path are the real ones. What the fork
saves is only the interpreter's start and its imports (a second of CPU each, for ~2,000
CLI calls and ~1,000 JAX programs, on CI's 2 cores): this server imports what they all
import, then forks a child per call; the child takes the caller's stdin, stdout and
stderr (passed over a Unix socket), working directory and environment, and runs the
module (as `python -m` does) or the program file (as `python FILE` does) there, then
exits as any process does (atexit, the store's exit flush, finalization). The server
stays single-threaded, so a fork never copies a lock another of its threads held.

`python fork_server.py SOCKET cli` imports the CLI's modules (never JAX); `... jax`
imports JAX, which reads its configuration from the environment as it is imported: the
client (tests/forks.py) forks only calls whose environment agrees with the server's on
every variable read at start-up, and starts a fresh interpreter for the others. Run as
`python -c` (sys.path[0] is the working directory, as with `-m`); it serves until its
parent exits.

Protocol, per connection: 8 bytes (length, big-endian) with three descriptors (stdin,
stdout, stderr), then that many bytes of JSON {"module" or "path", "args", "env", "cwd"};
the answer is the child's pid, a line, then its wait status, a line.
"""

from __future__ import annotations

import gc
import json
import os
import select
import socket
import struct
import sys


def _preload(kind: str) -> None:
    if kind == "cli":  # what every command imports, and most then: the index, boto3
        import boto3  # noqa: F401

        import artifactstore.cli.app
        import artifactstore.index.db
        import artifactstore.index.repo  # noqa: F401
    else:  # what every JAX program imports first (nothing of ours: they time that)
        import jax
        import jax.numpy  # noqa: F401


def _serve(path: str, set_by_imports: dict[str, str]) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".new")
    server.listen(64)
    os.rename(path + ".new", path)  # connectable once it exists
    parent = os.getppid()
    waiting: dict[int, socket.socket] = {}
    gc.freeze()  # the children's collections leave the imported modules' pages shared
    while os.getppid() == parent:
        ready, _, _ = select.select([server], [], [], 0.01 if waiting else 0.5)
        if ready:
            conn, _ = server.accept()
            head, fds, _, _ = socket.recv_fds(conn, 8, 3)
            (size,) = struct.unpack("!Q", head)
            body = b""
            while len(body) < size:
                body += conn.recv(size - len(body))
            request = json.loads(body)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the new process; its SystemExit ends it as it ends any
                server.close()
                conn.close()
                _become(request, fds, set_by_imports)
                return
            for fd in fds:
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(f"{status}\n".encode())
                except OSError:
                    pass
                conn.close()


def _become(request: dict[str, object], fds: list[int], set_by_imports: dict[str, str]) -> None:
    """Turn this forked child into `python -m MODULE ARGS` or `python PATH ARGS`; what the
    server's imports set in the environment (`import jax`: TF_CPP_MIN_LOG_LEVEL, unless
    set) is set as a fresh process's imports would."""
    import runpy

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(str(request["cwd"]))
    os.environ.clear()
    os.environ.update(request["env"])  # type: ignore[arg-type]
    for name, value in set_by_imports.items():
        os.environ.setdefault(name, value)
    args = [str(a) for a in request["args"]]  # type: ignore[attr-defined]
    if "module" in request:
        sys.argv = ["-m", *args]
        runpy.run_module(str(request["module"]), run_name="__main__", alter_sys=True)
    else:
        path = str(request["path"])
        sys.path[0] = os.path.dirname(path)  # as `python PATH` puts it
        sys.argv = [path, *args]
        runpy.run_path(path, run_name="__main__")
    sys.exit(0)


if __name__ == "__main__":
    before = dict(os.environ)
    _preload(sys.argv[2])
    _serve(sys.argv[1], {k: v for k, v in os.environ.items() if k not in before})
