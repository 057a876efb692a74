"""A real S3 server (moto, a subprocess on loopback) behind a fault-injecting HTTP/1.1 proxy, for the
remote-read tests and scripts/bench_remote.py.

The proxy is a threading TCP server that parses each request on a kept-alive connection, forwards it
to moto and can spoil the answer: reset the connection (TCP RST), cut the body, shorten it, delay it,
answer 503 SlowDown, ignore `Range`, add bytes; it can reset every Nth new connection outright, add a
fixed latency to every request (the round trip of a real object store), and counts the requests it
saw (GETs of shard bytes are what coalescing saves). Everything started here has a timeout and is
stopped by the context manager's exit, so no test can hang on it.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

DELAY_S = 1.5  # "delay" holds a response this long: past the tests' 1 s attempt timeout
CUT_AT = 700  # "cut" / "short" send this many body bytes
SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message></Error>")
DENIED = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
          b"<Message>Access Denied</Message></Error>")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection", "expect"}
CREDENTIALS = {"aws_access_key_id": "test", "aws_secret_access_key": "test", "region_name": "us-east-1"}
START_TIMEOUT_S = 30.0


class FaultProxy(socketserver.ThreadingTCPServer):
    """An HTTP/1.1 proxy to `upstream` that spoils every `every`-th response whose path contains
    `only` and ends with `suffix` (the request is counted either way), at most `per_target` times
    for one (method, path, Range), so a retry eventually gets through whatever the threads'
    interleaving. Modes: reset (RST instead of a response), cut (Content-Length kept, body stopped
    after CUT_AT bytes, RST), short (a consistent response of CUT_AT bytes), delay (DELAY_S before
    answering), 503 (SlowDown), 403 (AccessDenied, answered without forwarding: a denied upload
    writes nothing), ignore_range (the request forwarded without Range: 200 and the whole object),
    extra (206 with 100 bytes too many); `method` limits the faults to one HTTP method.

    Independently of the mode: `reset_every` > 0 resets every that-many-th new connection before it
    is read (a middlebox dropping connections), and `latency_s` is added before every answer."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream: int) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.upstream = upstream
        self.mode: str | None = None
        self.every, self.only, self.suffix, self.per_target, self.method = 3, "", "", 2, ""
        self.count, self.faults = 0, 0
        self.spoiled: dict[tuple[str, str, str], int] = {}
        self.latency_s, self.reset_every, self.connections = 0.0, 0, 0
        self.requests: Counter[tuple[str, str]] = Counter()  # (method, path) -> requests seen
        self.ranges: list[tuple[str, str, str]] = []  # (method, path, Range header or "") of every request
        self.lock = threading.Lock()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def configure(self, mode: str | None, every: int = 3, only: str = "", per_target: int = 2,
                  latency_s: float = 0.0, reset_every: int = 0, suffix: str = "", method: str = "") -> None:
        """Set the faults and zero every counter; `method` ("PUT"): spoil only requests of that method."""
        with self.lock:
            self.mode, self.every, self.only, self.per_target = mode, every, only, per_target
            self.suffix, self.method = suffix, method
            self.latency_s, self.reset_every = latency_s, reset_every
            self.count, self.faults, self.spoiled, self.connections = 0, 0, {}, 0
            self.requests = Counter()
            self.ranges = []

    def gets(self, suffix: str = ".tar") -> int:
        """GET requests seen (faulty ones included) for paths ending in `suffix`."""
        with self.lock:
            return sum(n for (method, path), n in self.requests.items()
                       if method == "GET" and path.split("?")[0].endswith(suffix))

    def connection_fault(self) -> bool:
        with self.lock:
            self.connections += 1
            if self.reset_every and self.connections % self.reset_every == 0:
                self.faults += 1
                return True
            return False

    def fault_for(self, method: str, path: str, headers: dict[str, str]) -> str | None:
        with self.lock:
            self.requests[(method, path)] += 1
            self.ranges.append((method, path, headers.get("range", "")))
            if (self.mode is None or self.only not in path or (self.method and method != self.method)
                    or not path.split("?")[0].endswith(self.suffix)):
                return None
            self.count += 1
            target = (method, path, headers.get("range", ""))
            if self.count % self.every or self.spoiled.get(target, 0) >= self.per_target:
                return None
            self.spoiled[target] = self.spoiled.get(target, 0) + 1
            self.faults += 1
            return self.mode


class _ProxyHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: FaultProxy = self.server  # type: ignore[assignment]
        conn: socket.socket = self.request
        conn.settimeout(60)  # a client that goes quiet does not hold a thread forever
        if server.connection_fault():
            _reset(conn)
            return
        reader = conn.makefile("rb")
        try:
            while True:
                line = reader.readline()
                if not line.strip():
                    return
                method, path, _ = line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                raw: list[tuple[str, str]] = []
                while (h := reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = h.decode("latin-1").partition(":")
                    raw.append((name.strip(), value.strip()))
                    headers[name.strip().lower()] = value.strip()
                if headers.get("expect", "").lower() == "100-continue":  # uploads wait for it before the body
                    conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = reader.read(int(headers.get("content-length", 0) or 0))
                fault = server.fault_for(method, path, headers)
                if server.latency_s:
                    time.sleep(server.latency_s)
                if fault == "reset":
                    _reset(conn)
                    return
                if fault == "403":  # denied before it reaches the store: a denied upload writes nothing
                    head = ["HTTP/1.1 403 Forbidden", "Content-Type: application/xml", f"Content-Length: {len(DENIED)}",
                            "Connection: keep-alive"]
                    body = b"" if method == "HEAD" else DENIED
                    conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
                    continue
                forward = {k: v for k, v in raw if k.lower() not in HOP_BY_HOP
                           and not (fault == "ignore_range" and k.lower() == "range")}
                upstream = http.client.HTTPConnection("127.0.0.1", server.upstream, timeout=30)
                upstream.request(method, path, body=body or None, headers=forward)
                response = upstream.getresponse()
                status, reason, data = response.status, response.reason, response.read()
                out = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]
                length = int(response.getheader("content-length") or len(data))
                upstream.close()
                if fault == "delay":
                    time.sleep(DELAY_S)
                elif fault == "503":
                    status, reason, data = 503, "Slow Down", SLOWDOWN
                    length, out = len(data), [("Content-Type", "application/xml")]
                elif fault == "short" and method == "GET":
                    data, length = data[:CUT_AT], min(CUT_AT, len(data))
                elif fault == "extra" and method == "GET":
                    data, length = data + b"\0" * 100, len(data) + 100
                head = [f"HTTP/1.1 {status} {reason}", *(f"{k}: {v}" for k, v in out),
                        f"Content-Length: {length}", "Connection: keep-alive"]
                conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
                if method == "HEAD":
                    continue
                if fault == "cut":
                    conn.sendall(data[:CUT_AT])
                    _reset(conn)
                    return
                conn.sendall(data)
        except OSError:  # the client gave up on a delayed response, or went away
            return


def _reset(conn: socket.socket) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a crashed peer or middlebox does."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto server exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"moto server not listening on {port} after {START_TIMEOUT_S} s")


@contextlib.contextmanager
def s3_behind_proxy(folders: dict[str, Path], bucket: str = "robots") -> Iterator[tuple[FaultProxy, dict[str, Any]]]:
    """(proxy, s3fs storage_options reaching moto through it); every file under folders[prefix]
    uploaded (directly to moto) as s3://bucket/prefix/<relative path>. Stops both on exit."""
    import boto3

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proxy = FaultProxy(port)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        _wait_for(port, server)
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", **CREDENTIALS)
        client.create_bucket(Bucket=bucket)
        for prefix, folder in folders.items():
            for path in sorted(folder.rglob("*")):
                if path.is_file():
                    client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")
        yield proxy, {"key": "test", "secret": "test", "skip_instance_cache": True,
                      "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}", "region_name": "us-east-1"}}
    finally:
        proxy.shutdown()
        proxy.server_close()
        thread.join(timeout=10)
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


def moto_client(proxy: FaultProxy) -> Any:
    """A boto3 client talking to moto itself (around the proxy), for uploads the tests need."""
    import boto3

    return boto3.client("s3", endpoint_url=f"http://127.0.0.1:{proxy.upstream}", **CREDENTIALS)
