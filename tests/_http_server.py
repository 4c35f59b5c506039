"""A local HTTP server for the path and download tests (127.0.0.1 only, never the internet).

Routes, each serving ``server.files[<name>]``:

* ``/files/<name>``     the file, with ``Content-Length``
* ``/slow/<name>``      the same, written in small chunks with short pauses
* ``/truncated/<name>`` announces the full length, sends half, then hangs up
* ``/nolength/<name>``  no ``Content-Length``; the end of the body is the closed connection
* ``/status/<code>``    an error response with that status
* ``/stall/<name>``     announces the full length, sends the first ``STALL_BYTES`` bytes, then
  sends nothing more until the server stops (or 30 s pass)
* ``/loop/<name>``      redirects to itself, for ever
* ``/redirect/<name>``  redirects to ``/files/<name>``
* ``/away/<name>?to=<url>`` redirects to ``<url>`` (another server)
* ``/auth/<name>``      the file if the request has basic auth for ``server.credentials``
  (``(user, password)``), else 401

Every request is counted in ``server.hits[<path without query>]``; the ``Authorization``
header of each is kept in ``server.authorizations[<path>]`` (None when absent).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

STALL_BYTES = 1000


class _Handler(BaseHTTPRequestHandler):
    server: LocalHTTPServer
    protocol_version = "HTTP/1.0"  # one request per connection: the body ends with it

    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        parts = urlsplit(self.path)
        path = parts.path
        self.server.count(path, self.headers.get("Authorization"))
        route, _, name = path.lstrip("/").partition("/")
        if route == "status":
            self.send_error(int(name))
            return
        if route in ("loop", "redirect", "away"):
            if route == "loop":
                target = path
            elif route == "redirect":
                target = f"/files/{name}"
            else:
                target = parse_qs(parts.query)["to"][0]
            self.send_response(302)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if route == "auth":
            user, password = self.server.credentials
            expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="test"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            route = "files"
        body = self.server.files.get(unquote(name))
        routes = ("files", "slow", "truncated", "nolength", "stall")
        if body is None or route not in routes:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        if route != "nolength":
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if head:
            return
        if route == "truncated":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        elif route == "stall":
            self.wfile.write(body[:STALL_BYTES])
            self.wfile.flush()
            self.server.stopping.wait(timeout=30)
        elif route == "slow":
            for i in range(0, len(body), 16384):
                self.wfile.write(body[i : i + 16384])
                self.wfile.flush()
                time.sleep(0.005)
        else:
            self.wfile.write(body)


class LocalHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files = files
        self.hits: collections.Counter[str] = collections.Counter()
        self.authorizations: dict[str, str | None] = {}
        self.credentials = ("user", "p@ss:word")
        self.stopping = threading.Event()
        self._hits_lock = threading.Lock()

    def count(self, path: str, authorization: str | None = None) -> None:
        with self._hits_lock:
            self.hits[path] += 1
            self.authorizations[path] = authorization

    def url(self, path: str) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}{path}"


@contextlib.contextmanager
def serve(files: dict[str, bytes]) -> Iterator[LocalHTTPServer]:
    """Run a :class:`LocalHTTPServer` in a thread for the duration of the block."""
    server = LocalHTTPServer(files)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def unused_port() -> int:
    """A local TCP port on which nothing listens (bound, then closed at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def children(script: str, n: int, *args: str) -> Iterator[list]:
    """Start ``n`` Python processes running ``script`` (argv: ``args``), pipes on stdin and
    stdout; kill whatever is still running when the block ends."""
    import subprocess
    import sys

    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            for stream in (p.stdin, p.stdout):
                if stream is not None:
                    stream.close()
