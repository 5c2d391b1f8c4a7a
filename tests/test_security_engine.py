"""Secrets and commands against real vLLM (issue 12): a server command of the user's, with a JSON flag
(`--limit-mm-per-prompt '{"image": 4}'`, passed through unchanged) and API keys in the command, in the
configuration's flags and in its environment. vLLM prints its arguments, keys included, into its log; the
requests are authenticated; no byte written under results and no terminal line holds any key."""

from __future__ import annotations

import json
import os
import re
import uuid

import pytest
from conftest import REPORT_VERSION, require_engine_and_model
from locust_run import rows
from test_security import cli, grep_tree

from mmchaos import paths, schema
from mmchaos.harness.servers import engines

pytestmark = pytest.mark.engine


def test_a_users_command_with_a_json_flag_and_keys_everywhere(tmp_path):
    require_engine_and_model(REPORT_VERSION)
    e = engines.require(REPORT_VERSION)
    keys = {k: f"sk-{k}-{uuid.uuid4().hex}" for k in ("command", "flags", "env", "token")}
    command = (
        f"{e.python} {engines.LAUNCHER} serve {{model}} --host {{host}} --port {{port}} --runner pooling "
        """--max-model-len 4096 --dtype bfloat16 -O0 --limit-mm-per-prompt '{"image": 4}' """
        f"--api-key {keys['command']}"
    )
    f = tmp_path / "keyed.toml"
    f.write_text(f"""
[campaign]
name = "keyed-vllm"
target = "command"
model = "{paths.default_model_dir()}"
command = '''{command}'''

[workload]
users = 2
spawn_rate = 2
duration = 120
max_requests = 60

[workload.mix]
valid_image = 4
malformed_post = 1
text = 0
multi_image = 0
batch = 0
tokenize = 0
malformed_pre = 0
abort = 0

[workload.options]
image_preset = "small"
malformed_cases = "dimensions_unsupported"
fresh_fraction = 1.0  # no image is sent twice: the 400s cannot drift the cache into a crash (seen in CI)

[crash]
startup_timeout = 420

[[config]]
name = "keyed"
flags = ["--api-key", "{keys["flags"]}"]
env = {{ VLLM_API_KEY = "{keys["env"]}", HF_TOKEN = "{keys["token"]}", VLLM_CPU_KVCACHE_SPACE = "1", HF_HUB_OFFLINE = "1", VLLM_CACHE_ROOT = "{paths.vllm_cache_root(REPORT_VERSION)}" }}
""")
    root = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMCHAOS_API_KEY")}
    run = cli("campaign", "run", str(f), "--results", str(root), env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    trial = root / "keyed-vllm" / "keyed" / "t000"
    log = (trial / schema.SERVER_LOG).read_text()
    # vLLM's argument dump (a string on 0.30, a list on later versions), masked
    assert re.search(r"'api_key': \[?'\*\*\*'", log) and "limit_mm_per_prompt" in log
    df = rows(trial)
    posts = df[df["endpoint"] == "/v1/embeddings"]
    assert (posts["status"] != 401).all() and (posts["outcome"] == schema.OK).sum() > 10, posts["error"].unique()
    assert (posts.loc[posts["kind"] == "malformed_post", "status"] == 400).all()
    rep = cli("report", str(root / "keyed-vllm"), env=env, timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert grep_tree(root, list(keys.values())) == []
    for out in (run.stdout, run.stderr, rep.stdout, rep.stderr):
        assert not [k for k in keys.values() if k in out]
    manifest = json.loads((trial / schema.MANIFEST).read_text())
    assert '{"image": 4}' in manifest["target_detail"]["command"]
