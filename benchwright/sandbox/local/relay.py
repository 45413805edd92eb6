"""The host side of a local sandbox's egress: a relay from the sandbox's Unix socket to the egress proxy's TCP
address (see ``local``'s module docstring, **Network**)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
from urllib.parse import urlsplit

from benchwright.stack.procreg import owned_tempdir

# ------------------------------------------------------------------------------------------------- egress relay ---


class _EgressRelay:
    """Host end of the egress path: a Unix socket whose every connection is piped to one host TCP address.

    Threads, not asyncio: it must keep serving whatever event loop (or none) the backend's caller runs.

    A warm sandbox's relay (``benchwright.sandbox.local.warm``) is made without a target: until ``retarget`` gives it
    the claiming run's egress proxy, every connection is closed at once.
    """

    def __init__(self, host: str | None, port: int = 0) -> None:
        self.target = (host, port) if host is not None else None
        self._dir = owned_tempdir("egress")  # a short path: sun_path is 108 bytes
        self.socket_path = self._dir / "egress.sock"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        self._listener.listen(128)
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name="sandbox-egress", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def retarget(self, host: str, port: int) -> None:
        """Pipe every later connection to ``host:port``."""
        self.target = (host, port)

    def _serve(self, client: socket.socket) -> None:
        target = self.target
        if target is None:
            client.close()
            return
        try:
            upstream = socket.create_connection(target, timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        upstream.close()
        client.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _parse_proxy_url(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "//" in url else f"http://{url}")
    if parts.scheme not in ("http", "") or not parts.hostname or not parts.port:
        raise ValueError(f"egress_proxy_url must be http://HOST:PORT, got {url!r}")
    return parts.hostname, parts.port
