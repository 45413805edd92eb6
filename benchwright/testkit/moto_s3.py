"""A real S3-protocol server for tests: moto's server mode (``moto[server]``, a test dependency) as a subprocess.

moto implements the S3 REST API (SigV4 auth, PUT/GET/HEAD object, buckets) in memory; boto3 talks to it exactly as
to AWS. Started on a free loopback port, stopped by the caller.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class MotoS3:
    """A running moto S3 server: ``endpoint_url`` for boto3, and the environment a client process needs."""

    proc: subprocess.Popen[bytes]
    endpoint_url: str

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_moto_s3(*, timeout_s: float = 30.0) -> MotoS3:
    """Start moto's server on a free port and wait until it answers (polled, with a deadline).

    Raises:
        RuntimeError: it exited or did not answer within ``timeout_s``.
    """
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"moto server exited with {proc.returncode}: {err[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                return MotoS3(proc=proc, endpoint_url=url)
        except OSError:
            time.sleep(0.05)  # polling the server's readiness, not synchronising on a guess
    proc.kill()
    raise RuntimeError(f"moto server did not answer on {url} within {timeout_s} s")


@contextlib.contextmanager
def moto_s3_in_env() -> Iterator[MotoS3]:
    """A moto server for the block, with its credentials in this process's environment (where boto3 reads them);
    the environment is put back and the server stopped after."""
    server = start_moto_s3()
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    try:
        yield server
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
