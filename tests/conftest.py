"""Shared fixtures: real vLLM servers (engine-marked tests) and the stand-in server (plumbing tests)."""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path

import pytest

from mmchaos.harness import engines
from mmchaos.harness.server import Server, Target
from mmchaos import paths

TESTS = Path(__file__).resolve().parent
REPORT_VERSION = "0.30.0"  # the version of the original report
FIXED_VERSION = "0.32.0"  # cache miss made retryable


def require_engine_and_model(version: str) -> None:
    """Fail (never skip) an engine test whose engine or tiny model is missing, saying how to install it."""
    try:
        engines.require(version)
    except engines.EngineError as e:
        pytest.fail(f"{e} (or run `make test`, which installs them)")
    if not (paths.default_model_dir() / "config.json").is_file():
        pytest.fail("the tiny model is not built: run `mmchaos model build` (or `make test`)")


@contextlib.contextmanager
def vllm_server(version: str, flags: list[str], log: Path, timeout: float = 420):
    """A real vLLM server on the tiny model; fails (never skips) when the engine or model is missing."""
    require_engine_and_model(version)
    server = Server(Target(mode="engine", engine=version, flags=flags), log)
    server.start()
    try:
        server.wait_healthy(timeout)
        yield server
    finally:
        server.stop()
        assert not server.group_pids(), "server processes left behind"


SHARED = {"fixed_server", "workaround_server", "demo_campaign"}  # the session fixtures below


@pytest.hookimpl(tryfirst=True)  # before -m deselects by it
def pytest_collection_modifyitems(items):
    # `make test` runs the engine tests that share these servers in one lane and the others in another
    # (tests/run_lanes.py): a shared server is started once only when all its tests are in one pytest process
    for item in items:
        if SHARED & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.shared_server)


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
    with vllm_server(REPORT_VERSION, ["--mm-processor-cache-gb", "0"],
                     tmp_path_factory.mktemp("workaround") / "server.log") as s:
        yield s


@pytest.fixture(scope="session")
def demo_campaign(tmp_path_factory):
    """campaigns/demo.toml itself, one trial per configuration, against the real engines: the ground truth of the
    verdicts (test_ground_truth_engine.py) and the crash the minimizer starts from (test_minimize_engine.py).
    Returns (campaign folder, {config: TrialResult})."""
    from mmchaos.harness import campaign_plan, campaign_runner

    for version in (REPORT_VERSION, FIXED_VERSION):
        require_engine_and_model(version)
    root = tmp_path_factory.mktemp("demo")
    text = (TESTS.parent / "campaigns" / "demo.toml").read_text()
    text = re.sub(r"(?m)^trials = \d+", "trials = 1", text)
    text = text.replace('locustfile = "../locustfiles/embeddings.py"',
                        f'locustfile = "{TESTS.parent}/locustfiles/embeddings.py"')
    f = root / "demo.toml"
    f.write_text(text)
    results = campaign_runner.CampaignRunner(campaign_plan.load(f), root / "results").run()
    return root / "results" / "demo", {r.config: r for r in results}


@contextlib.contextmanager
def standin_server(log: Path, *args: str):
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
