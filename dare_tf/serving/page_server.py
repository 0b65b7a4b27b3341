"""The inspect page's own HTTP server: werkzeug's WSGI server on a fixed pool of
worker threads (`pooled_server`), the requests' headers read without a worker
(`HeaderGate`)."""

from __future__ import annotations

import time

# The page's own server: a fixed pool of worker threads, each connection's request read
# within a timeout from its acceptance, one request per connection (HTTP/1.0: an idle browser connection holds
# no worker). werkzeug's threaded server took a thread per open connection and never timed
# one out (300 half-sent requests: 311 threads).
PAGE_WORKERS, PAGE_REQUEST_TIMEOUT_S = 8, 10.0


def pooled_server(app, host: str, port: int, workers: int, request_timeout_s: float):
    """A werkzeug WSGI server of `app` on a pool of `workers` threads (see `page_server`)."""
    import logging
    from concurrent.futures import ThreadPoolExecutor

    from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler

    if workers < 1 or request_timeout_s <= 0:
        raise ValueError(f"workers={workers}, request_timeout_s={request_timeout_s}: both must be positive")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    # (the socket's timeout is set per connection, from its acceptance: see `_serve`)
    handler = type("PageRequestHandler", (WSGIRequestHandler,), {"timeout": None, "protocol_version": "HTTP/1.0"})

    class PooledServer(BaseWSGIServer):
        multithread = True

        def __init__(self):
            super().__init__(host, port, app, handler=handler)
            self.pool = ThreadPoolExecutor(workers, thread_name_prefix="inspect-page")
            self.gate = HeaderGate(lambda *job: self.pool.submit(self._serve, *job), self.shutdown_request)

        def process_request(self, request, client_address):
            self.gate.add(request, client_address, time.monotonic() + request_timeout_s)

        def _serve(self, request, client_address, deadline: float):
            """Serves one connection; one that waited past its deadline in the queue
            is closed unread, and a read waits at most until the deadline."""
            try:
                left = deadline - time.monotonic()
                if left > 0:
                    request.settimeout(left)
                    self.finish_request(request, client_address)
            except Exception:  # noqa: BLE001 - socketserver's own report, as its threads make
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)

        def server_close(self):
            super().server_close()
            self.gate.close()
            self.pool.shutdown(wait=False, cancel_futures=True)

    return PooledServer()


class HeaderGate:
    """One thread that holds accepted connections until their request header has
    arrived whole (peeked, left in the socket for the handler), then hands each to
    `ready(connection, address, deadline)`; one still incomplete at its deadline (or
    closed) goes to `drop`. Half-sent requests, however many, hold no worker
    (issue 68, 13: 300 of them held every worker for their timeout)."""

    END = b"\r\n\r\n"
    LIMIT = 65536  # a header this long is handed on as it is (the handler refuses it)

    def __init__(self, ready, drop):
        import selectors
        import socket
        import threading

        self.ready, self.drop, self.selector = ready, drop, selectors.DefaultSelector()
        self.waiting: dict = {}
        self.lock = threading.Lock()
        self.wake, self._woken = socket.socketpair()
        self.selector.register(self._woken, selectors.EVENT_READ)
        self.closed = False
        threading.Thread(target=self._run, daemon=True, name="inspect-page-gate").start()

    def add(self, connection, address, deadline: float) -> None:
        import selectors

        with self.lock:
            self.waiting[connection] = (address, deadline)
            self.selector.register(connection, selectors.EVENT_READ)
        self.wake.send(b"\0")

    def _release(self, connection, handler) -> None:
        with self.lock:
            address, deadline = self.waiting.pop(connection)
            self.selector.unregister(connection)
        handler(connection, address, deadline) if handler is self.ready else handler(connection)

    def _run(self) -> None:
        import socket

        while not self.closed:
            with self.lock:
                first = min((d for _, d in self.waiting.values()), default=None)
            timeout = None if first is None else max(first - time.monotonic(), 0)
            for key, _ in self.selector.select(timeout):
                if key.fileobj is self._woken:
                    self._woken.recv(4096)
                    continue
                try:
                    head = key.fileobj.recv(self.LIMIT, socket.MSG_PEEK)
                except OSError:
                    head = b""
                if not head:
                    self._release(key.fileobj, self.drop)
                elif self.END in head or len(head) >= self.LIMIT:
                    self._release(key.fileobj, self.ready)
            now = time.monotonic()
            with self.lock:
                late = [c for c, (_, deadline) in self.waiting.items() if deadline <= now]
            for connection in late:
                self._release(connection, self.drop)

    def close(self) -> None:
        self.closed = True
        self.wake.send(b"\0")
