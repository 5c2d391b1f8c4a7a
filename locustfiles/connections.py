"""Connections as the clients users run handle them (httpx under the OpenAI SDK, urllib3 under requests).

A server may close a keep-alive connection right after answering, without a ``Connection: close`` header: vLLM
(uvicorn) does after an unhandled error answered with 500. A pooled connection is checked for that close before it
is reused (geventhttpclient's ``ConnectionPool`` does: a readable idle socket is dropped), but a request sent a
moment after the answer can get the connection before the close arrives. It then gets no byte of response, and the
server never saw it: the request is sent once more, on a fresh connection, and the re-send is counted
(``reconnects``). A request that fails on a fresh connection is the server's failure, recorded as such.
"""

from __future__ import annotations

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


def install(session, base_url: str) -> ReconnectingClient:
    """Give a FastHttpSession (a user's ``self.client``) reconnecting clients, with the settings it was made with;
    returns the one for ``base_url`` (whose ``reconnects`` the user reads after each request)."""
    user_agent = session.client
    user_agent.clientpool = ReconnectingClientPool(**user_agent.clientpool.client_args)
    return user_agent.clientpool.get_client(base_url)
