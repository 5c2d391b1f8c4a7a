"""A request log written by hand, replayed by one campaign on real vLLM (issue 23): judged as its server behaved.

Someone's production log, written without mmchaos (a session gets a 400 for `dimensions` on an image, given as a
file path; another session sends the same image as a data URL), replayed on 0.30.0 default, 0.30.0 with the cache
off and 0.32.0 default, one trial each (three server starts): 0.30.0 default fails (it dies on the reuse), cache off
is clean, and 0.32.0 survives with retryable errors — its retryable 503 is retried as the OpenAI SDK retries it,
where a replay that sent each request once had judged it "fails". Every trial sent its whole log in a few seconds
of its 60 s and is completed, not interrupted. The incidents are attributed by the image the server named: the
cause of 0.30.0's crash and of 0.32.0's drift line is the 400 that poisoned it.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import campaign_toml
import pytest
from conftest import FIXED_VERSION, REPORT_VERSION, require_engine_and_model
from PIL import Image

from mmchaos import paths
from mmchaos.analysis import report
from mmchaos.analysis.attribution import attribute
from mmchaos.analysis.results import load_results
from mmchaos.analysis.verdict import verdicts
from mmchaos.harness.campaign import plan as campaign_plan
from mmchaos.harness.campaign import runner as campaign_runner
from mmchaos.tables import read_table

pytestmark = pytest.mark.engine


def _log(folder: Path) -> None:
    buf = io.BytesIO()
    Image.new("RGB", (320, 240), (30, 120, 200)).save(buf, format="JPEG", quality=90)
    (folder / "photo.jpg").write_bytes(buf.getvalue())
    model = str(paths.default_model_dir())

    def body(url, **extra):
        return {
            "model": model,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "a photo"}],
                }
            ],
            **extra,
        }

    lines = [
        {"t": 0, "session": "web-1", "body": {"model": model, "input": "hello"}},
        {"t": 1.0, "session": "web-1", "body": body("photo.jpg", dimensions=5), "status": 400},
        {
            "t": 2.0,
            "session": "web-2",
            "body": body("data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()),
        },
    ]
    (folder / "production.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def _campaign(folder: Path) -> Path:
    return campaign_toml.write_campaign(
        folder / "c.toml",
        campaign={"name": "fidelity", "target": "engine", "command": None},
        workload={
            "locustfile": None,
            "users": None,
            "spawn_rate": None,
            "trace": "production.jsonl",
            "replay_speed": 1,
            "duration": 60,
        },
        options={"image_preset": None, "pool_size": None},
        crash={"startup_timeout": 420},
        configs=[
            {"name": "v0.30-default", "engine": REPORT_VERSION},
            {"name": "v0.30-cache-off", "engine": REPORT_VERSION, "flags": ["--mm-processor-cache-gb", "0"]},
            {"name": "v0.32-default", "engine": FIXED_VERSION},
        ],
    )


@pytest.mark.timeout(1800)
def test_a_hand_written_log_replayed_is_judged_as_each_server_behaved(tmp_path):
    for version in (REPORT_VERSION, FIXED_VERSION):
        require_engine_and_model(version)
    _log(tmp_path)
    results = campaign_runner.CampaignRunner(campaign_plan.load(_campaign(tmp_path)), tmp_path / "results").run()
    by = {r.config: r for r in results}
    # sent its whole log well before its 60 s: completed (0.30.0's trial ended with its crash)
    assert [r.status for r in results] == ["completed"] * 3, results
    assert by["v0.30-cache-off"].error is None and by["v0.32-default"].error is None, results
    assert [c.chain for c in by["v0.30-default"].crashes] == ["cache_drift → detokenizer_assert"], results
    assert not by["v0.30-cache-off"].crashes and not by["v0.32-default"].crashes, results
    camp = tmp_path / "results" / "fidelity"
    for cfg in ("v0.30-cache-off", "v0.32-default"):
        m = json.loads((camp / cfg / "t000" / "manifest.json").read_text())
        assert m["replay"]["complete"] and m["replay"]["sent"] == 3, m["replay"]

    # 0.32.0 answered the reuse with the retryable 503; the replay retried it, as the SDK does, and it was cured
    rows = read_table(camp / "v0.32-default" / "t000", "requests").to_pandas().sort_values("t_start")
    reuse = rows[rows["request_group"] == rows["request_group"].iloc[-1]]
    assert list(reuse["status"]) == [503, 200] and list(reuse["final"]) == [False, True], rows

    c = load_results(camp)
    v = verdicts(c).set_index("config")["verdict"].to_dict()
    assert v == {"v0.30-default": "fails", "v0.30-cache-off": "clean", "v0.32-default": "retryable"}, v

    # the server named the image; the 400 that poisoned it is the cause of the drift and of the crash
    events, _ = attribute(c)
    caused = events[(events["cause_kind"] == "malformed_post") & (events["cause_status"] == 400)]
    assert set(zip(caused["config"].astype(str), caused["event"])) >= {
        ("v0.30-default", "crash"),
        ("v0.32-default", "drift"),
    }, events[["config", "event", "signature", "cause", "named_image"]]
    assert events.loc[events["config"].astype(str) == "v0.30-cache-off"].empty, events
    words = report.write_report(camp).markdown.read_text().split("In plain words:")[1].split("\n\n")[1]
    assert "1 of 1 crashes caused by malformed_post" in words and "malformed_pre" not in words, words
