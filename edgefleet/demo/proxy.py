"""A TCP relay between one agent and the broker, whose link the chaos schedule can cut.

The agent connects to the relay's port instead of the broker's. `cut` closes every relayed
connection (the agent sees a real disconnect: its socket is closed under it) and, until
`restore`, closes each new connection as soon as it is accepted, so its reconnect attempts
fail the way they do behind a dead uplink. The relay binds port 0 and reports the port it
got, so no other process can take it in between.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class UplinkRelay:
    def __init__(self, target_port: int, host: str = "127.0.0.1"):
        self.target = (host, target_port)
        self._listener = socket.create_server((host, 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = threading.Event()
        self._closed = threading.Event()
        self.refused = 0  # connections turned away while cut
        self._thread = threading.Thread(target=self._accept, name="uplink-relay", daemon=True)

    def start(self) -> UplinkRelay:
        """Accept and relay connections (the listener takes them from construction on)."""
        if self._thread.ident is None:
            self._thread.start()
        return self

    @property
    def is_cut(self) -> bool:
        return self._cut.is_set()

    def cut(self) -> None:
        """Drop the link: close what is relayed now and turn away what comes until restored."""
        self._cut.set()
        with self._lock:
            sockets, self._open = self._open, set()
        for sock in sockets:
            _close(sock)

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        _close(self._listener)
        self.cut()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self._cut.is_set():
                self.refused += 1
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)  # the broker is down: the agent sees that, as it would
                continue
            with self._lock:
                self._open.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(source, sink), name="uplink-relay-pump", daemon=True
                ).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(source)
                self._open.discard(sink)
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
