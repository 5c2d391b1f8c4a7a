"""Connections as the clients users run handle them (httpx under the OpenAI SDK, urllib3 under requests).

A server may close a keep-alive connection right after answering, without a ``Connection: close`` header: vLLM
(uvicorn) does after an unhandled error answered with 500. A pooled connection is checked for that close before it
is reused (geventhttpclient's ``ConnectionPool`` does: a readable idle socket is dropped), but a request sent a
moment after the answer can get the connection before the close arrives. It then gets no byte of response, and the
server never saw it: the request is sent once more, on a fresh connection, and the re-send is counted
(``reconnects``). A request that fails on a fresh connection is the server's failure, recorded as such.
"""

from __future__ import annotations

import select
import socket

from gevent.monkey import get_original
from geventhttpclient.client import HTTPClient, HTTPClientPool
from geventhttpclient.response import HTTPConnectionClosed
from geventhttpclient.url import URL

_poll = get_original("select", "poll")  # the kernel's poll, not gevent's cooperative stand-in


class ReconnectingClient(HTTPClient):
    """An HTTPClient that knows whether a request went out on a pooled connection or a new one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reconnects = 0  # re-sends of the current request; the user resets it per request
        self._created = 0
        pool = self._connection_pool
        create = pool._create_socket

        def counting_create():
            self._created += 1
            return create()

        pool._create_socket = counting_create
        pool._is_socket_alive = _idle_and_open

    def _drop_idle(self) -> None:
        """Close the pooled connections: idle as long as the dead one, they are likely closed too."""
        queue = self._connection_pool._socket_queue
        while not queue.empty():
            queue.get_nowait().close()

    def request(self, method, request_uri, body=b"", headers=None):
        created = self._created
        try:
            return super().request(method, request_uri, body=body, headers=headers)
        except HTTPConnectionClosed:
            if self._created != created:
                raise  # a fresh connection closed without an answer: that is the server's doing
            self._drop_idle()
            self.reconnects += 1
            return super().request(method, request_uri, body=body, headers=headers)


class ReconnectingClientPool(HTTPClientPool):
    """The per-user client pool of FastHttpSession, making :class:`ReconnectingClient` s."""

    def get_client(self, url):
        if not isinstance(url, URL):
            url = URL(url)
        key = url.host, url.port
        if key not in self.clients:
            self.clients[key] = ReconnectingClient.from_url(url, **self.client_args)
        return self.clients[key]


class OwnConnections:
    """New connections to the host of a user's client, one per call and never pooled: an abort hangs up on its own
    connection. Made by geventhttpclient as the client's pooled ones are (its TLS settings too), with the host
    looked up once: gevent answers each lookup in a thread of its hub's pool (a thread hop per abort, and threads
    that keep a malloc arena each)."""

    def __init__(self, session, base_url: str):
        args = {**session.client.clientpool.client_args, "concurrency": 1}
        self.client = HTTPClient.from_url(URL(base_url), **args)
        self.pool = self.client._connection_pool
        resolve, addresses = self.pool._resolve, []

        def resolve_once():
            if not addresses:
                addresses.extend(resolve())
            return addresses

        self.pool._resolve = resolve_once

    def __call__(self, timeout: float) -> socket.socket:
        """A new connection, ``timeout`` for connecting and for each read and write on it."""
        self.pool.connection_timeout = self.pool.network_timeout = timeout
        return self.pool._create_socket()

    def head(self, method: str, uri: str, body: bytes, headers: dict) -> bytes:
        """The request line and headers geventhttpclient sends with ``body`` (Host, Content-Length, ...)."""
        return self.client._build_request(method, uri, body, headers).encode("latin-1")


def _idle_and_open(sock) -> bool:
    """geventhttpclient's test of a pooled connection before its reuse (open, and not readable while idle: no close
    and no stray bytes from the server), asked of poll(2) with no wait: gevent's select sets up watchers and a wait
    for every request."""
    if sock is None or sock.fileno() < 0:
        return False
    poller = _poll()
    poller.register(sock.fileno(), select.POLLIN)
    return not poller.poll(0)


def install(session, base_url: str) -> ReconnectingClient:
    """Give a FastHttpSession (a user's ``self.client``) reconnecting clients, with the settings it was made with;
    returns the one for ``base_url`` (whose ``reconnects`` the user reads after each request)."""
    user_agent = session.client
    user_agent.clientpool = ReconnectingClientPool(**user_agent.clientpool.client_args)
    return user_agent.clientpool.get_client(base_url)
