"""A loopback TCP proxy that injects faults between a client and a real server.

The fault tests and `bench/soak.py` put one in front of the moto S3 server or
PostgreSQL and switch its mode while a real program runs::

    proxy = FaultProxy(("127.0.0.1", moto_port)).start()
    env["AWS_ENDPOINT_URL_S3"] = proxy.endpoint
    proxy.set_mode("freeze")      # the server stops answering (like SIGSTOP)
    proxy.set_mode("pass")

Modes (a change applies to open connections too, as it would for a real outage):
  pass      forward both ways
  down      refuse: the port is closed (connection refused), open connections reset
  freeze    accept and read, never answer; open connections stop forwarding
  http500 / http503
            answer every HTTP request with that status (an S3-style XML error), then close
  freeze-writes
            forward reads; an HTTP PUT or POST (an upload) is held unanswered, as in
            freeze, while every other request passes (a writer's lookups still answer)

With `log_requests=True` it also keeps the request line ("GET /bucket/key HTTP/1.1") of
every HTTP request it forwards, in `requests`: tests count what reaches the server
(`artstore pull` fetches no object twice) without touching the client.

Only the standard library: the S3 tests, the soak benchmark and a developer at a
shell (`python infra/faultproxy.py 127.0.0.1:5432 freeze`) share it.
"""

from __future__ import annotations

import contextlib
import re
import select
import socket
import struct
import sys
import threading
import time

MODES = ("pass", "down", "freeze", "http500", "http503", "freeze-writes")
_WRITES = (b"PUT ", b"POST ")
_REQUEST = re.compile(rb"(GET|HEAD|PUT|POST|DELETE) \S+ HTTP/1\.[01]\r\n")
_REASONS = {"http500": (500, "InternalError"), "http503": (503, "SlowDown")}


class FaultProxy:
    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_requests: bool = False,
    ):
        self.upstream = upstream
        self.log_requests = log_requests
        self.requests: list[str] = []  # request lines forwarded, with `log_requests`
        self.host = host
        self.port = port
        self.mode = "pass"
        self.connections = 0  # accepted so far: lets a test see that a client tried
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._stopped = False

    # -- control ------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FaultProxy:
        self._listen()
        return self

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown proxy mode {mode!r}: use one of {', '.join(MODES)}")
        with self._lock:
            old, self.mode = self.mode, mode
        if mode == old:
            return
        if mode == "down":
            self._close_listener()
        elif old == "down":
            self._listen()
        if mode in ("down", "http500", "http503"):
            self._reset_open()

    def stop(self) -> None:
        self._stopped = True
        self._close_listener()
        self._reset_open()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------
    def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(128)
        self.port = sock.getsockname()[1]
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def _close_listener(self) -> None:
        sock, self._listener = self._listener, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _reset_open(self) -> None:
        with self._lock:
            doomed, self._open = list(self._open), set()
        for sock in doomed:
            _close(sock, reset=True)

    def _accept(self, listener: socket.socket) -> None:
        while not self._stopped:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed: mode "down" or stop()
            self.connections += 1
            with self._lock:
                self._open.add(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        mode = self.mode
        if mode in _REASONS:
            self._answer_error(client, *_REASONS[mode])
            return
        if mode == "freeze":
            self._hold(client)
            return
        try:
            server = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            _close(client, reset=True)
            return
        with self._lock:
            self._open.add(server)
        self._pump(client, server)

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peers = {client: server, server: client}
        try:
            while not self._stopped:
                if self.mode == "freeze":
                    time.sleep(0.05)  # hold the bytes: the far side sees silence
                    continue
                if self.mode not in ("pass", "freeze-writes"):
                    break
                readable, _, _ = select.select(list(peers), [], [], 0.1)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client and self.log_requests and _REQUEST.match(data):
                        # As for freeze-writes: a request's method leads the chunk.
                        line = data.split(b"\r\n", 1)[0].decode("latin-1")
                        with self._lock:
                            self.requests.append(line)
                    if sock is client and self.mode == "freeze-writes" and data.startswith(_WRITES):
                        # A request starts a read of the client's side after the previous
                        # answer, so its method leads the chunk: an upload, held.
                        self._hold(client)
                        return
                    peers[sock].sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, server):
                _close(sock, reset=self.mode != "pass")
                with self._lock:
                    self._open.discard(sock)

    def _hold(self, client: socket.socket) -> None:
        """Read and discard until the mode changes; then drop the connection."""
        held = self.mode
        try:
            while not self._stopped and self.mode == held:
                readable, _, _ = select.select([client], [], [], 0.1)
                if readable and not client.recv(65536):
                    break
        except OSError:
            pass
        _close(client, reset=True)

    def _answer_error(self, client: socket.socket, status: int, code: str) -> None:
        try:
            client.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data and len(data) < 1 << 16:
                chunk = client.recv(65536)
                if not chunk:
                    break
                data += chunk
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>injected by faultproxy</Message></Error>"
            ).encode()
            head = (
                f"HTTP/1.1 {status} {code}\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            client.sendall(head + body)
        except OSError:
            pass
        _close(client, reset=False)


def _close(sock: socket.socket, *, reset: bool) -> None:
    with contextlib.suppress(OSError):
        if reset:  # RST, as a crashed or restarted server would send
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


def main(argv: list[str]) -> int:
    """`python infra/faultproxy.py HOST:PORT [MODE]`: proxy, then read modes from stdin."""
    if not argv or ":" not in argv[0]:
        print("usage: faultproxy.py HOST:PORT [MODE]; then type a mode per line", file=sys.stderr)
        return 2
    host, port = argv[0].rsplit(":", 1)
    proxy = FaultProxy((host, int(port))).start()
    proxy.set_mode(argv[1] if len(argv) > 1 else "pass")
    print(f"proxy on {proxy.endpoint} -> {argv[0]}, mode {proxy.mode}", file=sys.stderr)
    for line in sys.stdin:
        with contextlib.suppress(ValueError):
            proxy.set_mode(line.strip())
            print(f"mode {proxy.mode}", file=sys.stderr)
    proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
