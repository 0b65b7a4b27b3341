"""dare_tf.serving.page_server: the inspect page's server holds a fixed pool of workers
whatever its connections, reads the requests' headers without a worker, and drops a
client silent past its timeout."""

import socket
import threading
import time

from flask import Flask

from dare_tf.serving.page_server import pooled_server


def test_half_sent_requests_hold_no_worker_and_silent_clients_are_dropped():
    """Issue 59 (5), issue 68 (13): 300 connections that each sent half a request header took
    werkzeug's threaded server from 10 to 311 threads, then (the pool) held every worker
    until their timeout, so a whole request waited 8 s. Their headers are now awaited
    without a worker: a whole request is answered at once among them, the threads stay
    the pool's, and the silent clients are closed unanswered at their timeout."""
    app = Flask(__name__)
    app.get("/ping")(lambda: "pong")
    server = pooled_server(app, "127.0.0.1", 0, workers=4, request_timeout_s=3.0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    before = threading.active_count()
    clients = []
    try:
        for _ in range(300):
            client = socket.create_connection(("127.0.0.1", server.server_port), timeout=30)
            client.sendall(b"GET /ping HTTP/1.1\r\nHost: loc")  # half a header, then silence
            clients.append(client)
        time.sleep(0.3)
        opened = time.monotonic()
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=60) as whole:
            whole.sendall(b"GET /ping HTTP/1.1\r\nHost: localhost\r\n\r\n")
            answer = b""
            while chunk := whole.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"pong")
        assert time.monotonic() - opened < 1.5  # (before the silent ones' 3 s: not queued behind them)
        assert threading.active_count() <= before + 4
        for client in clients:
            assert client.recv(1024) == b""  # closed by the server at its timeout, unanswered
        assert time.monotonic() - opened < 10
        # A header sent in pieces is answered once whole.
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=30) as slow:
            slow.sendall(b"GET /ping HTTP/1.1\r\n")
            time.sleep(0.3)
            slow.sendall(b"Host: localhost\r\n\r\n")
            assert slow.recv(65536).startswith(b"HTTP/1.0 200")
    finally:
        for client in clients:
            client.close()
        server.shutdown()
        server.server_close()
