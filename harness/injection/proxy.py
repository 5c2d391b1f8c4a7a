"""The fault proxy: a TCP proxy on loopback between Locust and the server, whose network faults are switched on and
off during a run (mmchaos/faults.py's network kinds), as toxiproxy's toxics are.

Why our own: toxiproxy (the well-kept tool for this) is a Go server that is neither in Debian 12 nor on PyPI (its
Python packages are clients of that server), and the Python TCP proxies that are (toxic-proxy, 89 lines: latency and
a bandwidth cap only) do not do resets, silence or a slow reader. This one is small: asyncio on raw sockets in one
thread, so nothing is read from the server unless a fault lets it be (a slow reader holds the server's writes back
through TCP, not through a buffer of ours).

Faults act on connections already open (Locust's users keep theirs) and on new ones:

- ``latency``: each chunk of a response waits ``latency_ms`` ± ``jitter_ms`` (uniform) before it is passed on;
- ``bandwidth``: each connection passes ``kbps`` kB/s at most, requests and responses;
- ``reset``: after ``after_bytes`` bytes of a response (counted from the last bytes of its request) the client's
  connection is reset (RST) and the server's closed;
- ``silence``: bytes stop flowing both ways, and new connections are accepted and never answered (a half-open
  peer); when it ends, the connections it held are closed;
- ``slow_read``: responses are read from the server at ``kbps`` kB/s in small reads through a 4 KiB receive
  buffer, so the server's socket fills and its writes wait.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from dataclasses import dataclass, field

from mmchaos.errors import MmchaosError
from mmchaos.faults import BANDWIDTH, LATENCY, RESET, SILENCE, SLOW_READ

from ..servers.processes import LOOPBACK

CHUNK = 64 * 1024
SLOW_CHUNK = 1024
SLOW_RCVBUF = 4096


class ProxyError(MmchaosError):
    """The proxy could not start (one line)."""


@dataclass(eq=False)  # one per connection, kept in a set by identity
class _Conn:
    client: socket.socket
    upstream: socket.socket | None = None
    response_bytes: int = 0  # of the current response: since the client last sent
    tasks: list = field(default_factory=list)
    rcvbuf: int | None = None  # the upstream socket's own, while a slow reader shrinks it


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int, seed: int = 0):
        self.upstream = (upstream_host, upstream_port)
        self.host = LOOPBACK  # never another address: the proxy is for the load on this machine
        self.port: int | None = None
        self.active: dict[str, tuple[str, dict]] = {}  # fault id -> (kind, params)
        self.counts = {"connections": 0, "resets": 0, "silenced": 0}
        self._rng = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[_Conn] = set()
        self._changed = asyncio.Event()  # set when the faults change; bound to the loop at its first wait

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- control (from any thread) ---------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._loop.run_forever, name="mmchaos-fault-proxy", daemon=True)
        self._thread.start()
        try:
            self._call(self._listen())
        except OSError as e:
            self.stop()
            raise ProxyError(f"the fault proxy could not listen on {self.host}: {e.strerror or e}") from e
        return self

    def switch_on(self, fault_id: str, kind: str, params: dict) -> None:
        self._call(self._set(fault_id, (kind, dict(params))))

    def switch_off(self, fault_id: str) -> None:
        self._call(self._set(fault_id, None))

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop.is_running():
            try:
                self._call(self._close_all(), timeout=10)
            except (TimeoutError, RuntimeError):
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None
        if not self._loop.is_running():
            self._loop.close()

    def _call(self, coro, timeout: float = 10):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # -- in the loop -------------------------------------------------------------------------------------------
    async def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        sock.listen(512)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        self._listener = sock
        self._accepting = self._loop.create_task(self._accept_loop())

    async def _accept_loop(self) -> None:
        while True:
            client, _ = await self._loop.sock_accept(self._listener)
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.counts["connections"] += 1
            conn = _Conn(client)
            self._conns.add(conn)
            conn.tasks.append(self._loop.create_task(self._serve(conn)))

    async def _set(self, fault_id: str, value) -> None:
        if value is None:
            self.active.pop(fault_id, None)
        else:
            self.active[fault_id] = value
        self._changed.set()  # wakes whatever waits on the faults (silenced connections)
        self._changed = asyncio.Event()

    def _params(self, kind: str) -> dict | None:
        for k, p in self.active.values():
            if k == kind:
                return p
        return None

    async def _serve(self, conn: _Conn) -> None:
        try:
            if self._params(SILENCE) is not None:
                self.counts["silenced"] += 1
                while self._params(SILENCE) is not None:  # accepted, never answered
                    await self._changed.wait()
                return
            up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            up.setblocking(False)
            conn.upstream = up
            self._set_rcvbuf(conn, self._params(SLOW_READ) is not None)  # before connect: the window it offers
            try:
                await self._loop.sock_connect(up, self.upstream)
            except OSError:
                return  # the server is down: the client sees its connection closed, as it would without us
            up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pumps = [
                self._loop.create_task(self._pump(conn, conn.client, up, False)),
                self._loop.create_task(self._pump(conn, up, conn.client, True)),
            ]
            conn.tasks += pumps
            await asyncio.wait(pumps, return_when=asyncio.ALL_COMPLETED)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._close(conn)

    async def _pump(self, conn: _Conn, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        """One direction of a connection; ``downstream``: the server's answers to the client."""
        try:
            while True:
                while self._params(SILENCE) is not None:
                    await self._changed.wait()
                slow = self._params(SLOW_READ) if downstream else None
                self._set_rcvbuf(conn, slow is not None)
                rate = self._rate(slow)
                data = await self._loop.sock_recv(
                    src, SLOW_CHUNK if slow else min(CHUNK, max(1, int(rate / 10))) if rate else CHUNK
                )
                if not data:
                    dst.shutdown(socket.SHUT_WR)  # pass the half-close on (a response read to its end)
                    return
                if self._params(SILENCE) is not None:
                    continue  # bytes that arrive during a silence are lost, as on a dead link
                if not downstream:
                    conn.response_bytes = 0  # a request: the next bytes back begin its response
                elif (reset := self._params(RESET)) is not None:
                    room = int(reset["after_bytes"]) - conn.response_bytes
                    if len(data) > room:
                        if room > 0:
                            await self._loop.sock_sendall(dst, data[:room])
                        self._reset(conn)
                        return
                if downstream and (lat := self._params(LATENCY)) is not None:
                    jitter = lat.get("jitter_ms", 0)
                    await asyncio.sleep(max(0.0, lat["latency_ms"] + self._rng.uniform(-jitter, jitter)) / 1000)
                await self._loop.sock_sendall(dst, data)
                if downstream:
                    conn.response_bytes += len(data)
                rate = self._rate(slow if downstream else None)
                if rate:
                    await asyncio.sleep(len(data) / rate)
        except OSError:
            return

    def _rate(self, slow: dict | None) -> float:
        """Bytes per second this read may go at (0: as fast as it comes)."""
        rates = [p["kbps"] * 1000 for p in (slow, self._params(BANDWIDTH)) if p is not None]
        return min(rates) if rates else 0.0

    def _set_rcvbuf(self, conn: _Conn, small: bool) -> None:
        up = conn.upstream
        if up is None:
            return
        if small and conn.rcvbuf is None:
            conn.rcvbuf = up.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            up.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RCVBUF)
        elif not small and conn.rcvbuf is not None:
            up.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, conn.rcvbuf // 2)  # the kernel doubles what is set
            conn.rcvbuf = None

    def _reset(self, conn: _Conn) -> None:
        self.counts["resets"] += 1
        try:  # linger 0: close sends RST, not FIN
            conn.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self._close(conn)

    def _close(self, conn: _Conn) -> None:
        for s in (conn.client, conn.upstream):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        me = asyncio.current_task(self._loop)
        for t in conn.tasks:
            if t is not me and not t.done():
                t.cancel()
        self._conns.discard(conn)

    async def _close_all(self) -> None:
        self._accepting.cancel()
        self._listener.close()
        for conn in list(self._conns):
            self._close(conn)
        self.active.clear()
