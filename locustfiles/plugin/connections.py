"""Connections as the clients users run handle them (httpx under the OpenAI SDK, urllib3 under requests).

A server may close a keep-alive connection right after answering, without a ``Connection: close`` header: vLLM
(uvicorn) does after an unhandled error answered with 500. A pooled connection is checked for that close before it
is reused (geventhttpclient's ``ConnectionPool`` does: a readable idle socket is dropped), but a request sent a
moment after the answer can get the connection before the close arrives. It then gets no byte of response, and the
server never saw it: the request is sent once more, on a fresh connection, and the re-send is counted
(``reconnects``). A request that fails on a fresh connection is the server's failure, recorded as such.
"""

from __future__ import annotations

import socket

from geventhttpclient.client import HTTPClient, HTTPClientPool
from geventhttpclient.response import HTTPConnectionClosed
from geventhttpclient.url import URL


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


class LookedUpOnce:
    """``socket.create_connection`` for http.client connections to one host, the host looked up once: an abort opens
    a connection of its own every time, and gevent answers each lookup in a thread of its hub's pool (a thread hop
    per abort, and threads that keep a malloc arena each). Connecting to the numeric address looks nothing up."""

    def __init__(self) -> None:
        self.addresses: list = []

    def __call__(self, address, timeout: float, source_address=None) -> socket.socket:
        if not self.addresses:
            self.addresses = socket.getaddrinfo(address[0], address[1], 0, socket.SOCK_STREAM)
        error: OSError | None = None
        for family, kind, proto, _, sockaddr in self.addresses:  # as create_connection: the first that connects
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(timeout)
                sock.connect(sockaddr)
                return sock
            except OSError as e:
                sock.close()
                error = e
        raise error or OSError(f"no address for {address[0]}")


def install(session, base_url: str) -> ReconnectingClient:
    """Give a FastHttpSession (a user's ``self.client``) reconnecting clients, with the settings it was made with;
    returns the one for ``base_url`` (whose ``reconnects`` the user reads after each request)."""
    user_agent = session.client
    user_agent.clientpool = ReconnectingClientPool(**user_agent.clientpool.client_args)
    return user_agent.clientpool.get_client(base_url)
