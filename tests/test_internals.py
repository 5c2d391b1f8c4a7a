"""The private parts of our dependencies that mmchaos reaches into, checked against what is installed.

We reach into three places no public API covers: geventhttpclient's connection pool (locustfiles/plugin/connections.py
counts the sockets it creates and drops idle ones), ``http.client``'s ``_create_connection`` hook (the aborts'
connections, locustfiles/plugin/chaos_user.py) and Locust's run state (the runner's ``state`` and ``shape_greenlet``,
its workers' states, the FastHttpSession's client pool: plugin.py, webui.py, shipping.py). pyproject.toml pins
the releases these were read in. When a release moves one of them, the test of it fails saying what moved, where
we use it and what range is pinned: read the new release's code, adapt ours, then widen the range.
"""

from __future__ import annotations

import http.client
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PINNED = {
    Requirement(r).name: Requirement(r)
    for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
}


def moved(package: str, what: str, where: str) -> str:
    """The one message of every check here."""
    version = sys.version.split()[0] if package == "python" else metadata.version(package)
    pin = f"requires-python {_python_pin()}" if package == "python" else f"{PINNED[package]}"
    return (
        f"{package} {version}: {what} moved (mmchaos uses it in {where}); pyproject.toml pins {pin}. Read this "
        f"release's code, adapt ours, then widen the pin"
    )


def _python_pin() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]


@pytest.mark.parametrize("package", ["locust", "geventhttpclient"])
def test_the_installed_release_is_one_pinned(package):
    """pip keeps to the pins at install; a virtualenv upgraded by hand may not."""
    pin = PINNED.get(package)
    assert pin is not None, f"pyproject.toml does not name {package}: we use its private parts (this test's module)"
    assert any(s.operator in ("<", "<=", "==", "~=") for s in pin.specifier), (
        f"pyproject.toml pins no upper bound for {package} ({pin}): we use its private parts, see this test's module"
    )
    version = metadata.version(package)
    assert pin.specifier.contains(version), (
        f"{package} {version} is installed, outside the range pyproject.toml pins ({pin}): reinstall (make setup)"
    )


def test_http_client_connects_through_its_create_connection_hook():
    called = []

    def hook(address, timeout, source_address=None):
        called.append(address)
        raise ConnectionRefusedError("refused by the hook")

    conn = http.client.HTTPConnection("127.0.0.1", 9, timeout=1)
    assert hasattr(conn, "_create_connection"), moved(
        "python", "HTTPConnection._create_connection", "locustfiles/plugin/chaos_user.py (_abort)"
    )
    conn._create_connection = hook
    with pytest.raises(ConnectionRefusedError):
        conn.connect()
    assert called == [("127.0.0.1", 9)], moved(
        "python", "HTTPConnection.connect() calling _create_connection", "locustfiles/plugin/chaos_user.py (_abort)"
    )


def test_geventhttpclient_pool_creates_sockets_through_create_socket_and_queues_idle_ones(standin_here):
    from geventhttpclient.client import HTTPClient, HTTPClientPool

    from mmchaos.locustfiles.plugin.connections import ReconnectingClient, ReconnectingClientPool

    where = "locustfiles/plugin/connections.py (ReconnectingClient)"
    pool = HTTPClient("127.0.0.1", 9)._connection_pool
    assert callable(getattr(pool, "_create_socket", None)), moved(
        "geventhttpclient", "ConnectionPool._create_socket", where
    )
    queue = getattr(pool, "_socket_queue", None)
    assert hasattr(queue, "empty") and hasattr(queue, "get_nowait"), moved(
        "geventhttpclient", "ConnectionPool._socket_queue (a queue of idle sockets)", where
    )
    assert {"clients", "client_args"} <= set(vars(HTTPClientPool(concurrency=1))), moved(
        "geventhttpclient", "HTTPClientPool.clients / .client_args", "locustfiles/plugin/connections.py (install)"
    )
    with standin_here() as s:
        client = ReconnectingClient.from_url(s.base_url, concurrency=1)
        try:
            for _ in range(3):
                assert client.request("GET", "/health").status_code == 200
            assert client._created == 1, moved(
                "geventhttpclient", "the pool creating each socket by _create_socket and reusing idle ones", where
            )
            client._drop_idle()
            assert client.request("GET", "/health").status_code == 200
            assert client._created == 2, moved("geventhttpclient", "the pool's _socket_queue of idle sockets", where)
        finally:
            client.close()
    assert issubclass(ReconnectingClientPool, HTTPClientPool)


def test_a_fast_http_session_takes_our_client_pool(standin_here, inprocess_locust):
    from locust import FastHttpUser
    from locust.env import Environment

    from mmchaos.locustfiles.plugin import connections

    where = "locustfiles/plugin/connections.py (install)"
    with standin_here() as s:
        session = type("U", (FastHttpUser,), {"host": s.base_url, "abstract": False})(Environment()).client
        assert hasattr(getattr(session, "client", None), "clientpool"), moved(
            "locust", "FastHttpSession.client.clientpool", where
        )
        ours = connections.install(session, s.base_url)
        r = session.get("/health")
        assert r.status_code == 200, f"{r.error!r}: " + moved("locust", "FastHttpSession's requests", where)
        assert ours._created == 1, moved(
            "locust", "FastHttpSession sending through client.clientpool.get_client", where
        )


def test_the_runner_state_we_read_and_end(inprocess_locust):
    import gevent
    from locust import LoadTestShape, User, constant, task
    from locust.env import Environment
    from locust.runners import STATE_INIT, STATE_STOPPED, WorkerNode

    class Idle(User):
        wait_time = constant(0.01)

        @task
        def nothing(self):
            pass

    class OneTick(LoadTestShape):
        def tick(self):
            return (1, 1) if self.get_run_time() < 0.2 else None

    where = "locustfiles/plugin/listeners.py (_end_shape_on_sigterm), webui.py (_runner_state)"
    env = Environment(user_classes=[Idle], shape_class=OneTick())
    runner = env.create_local_runner()
    try:
        assert runner.state == STATE_INIT, moved("locust", "Runner.state starting at STATE_INIT", where)
        assert hasattr(runner, "shape_greenlet") and runner.shape_greenlet is None, moved(
            "locust", "Runner.shape_greenlet (None before a shape runs)", where
        )
        runner.start_shape()
        assert isinstance(runner.shape_greenlet, gevent.Greenlet), moved(
            "locust", "Runner.start_shape() setting shape_greenlet", where
        )
        runner.shape_greenlet.join(timeout=30)
        assert runner.shape_greenlet is None and runner.state == STATE_STOPPED, moved(
            "locust", "a shape's end clearing shape_greenlet and stopping the runner", where
        )
        assert hasattr(env, "process_exit_code"), moved(
            "locust", "Environment.process_exit_code", "locustfiles/plugin/listeners.py (the gates' exit code)"
        )
        env.mmchaos = "run state"  # the plugin keeps its run state on the Environment (run_state.py)
        assert env.mmchaos == "run state", moved(
            "locust",
            "Environment taking attributes of a plugin",
            "locustfiles/plugin/run_state.py (environment.mmchaos)",
        )
    finally:
        runner.quit()
    assert WorkerNode("w").state == STATE_INIT, moved(
        "locust", "WorkerNode.state", "locustfiles/plugin/shipping.py (workers gone missing)"
    )
