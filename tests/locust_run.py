"""Run Locust as users do (the CLI, headless), for tests: bounded in time, its own process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from mmchaos import schema
from mmchaos.options import WEIGHTS
from mmchaos.tables import read_table

ROOT = Path(__file__).resolve().parent.parent


def locust(
    locustfile: str, host: str, out: Path, *args: str, users: int = 4, seconds: int = 4, timeout: float = 120
) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(ROOT / locustfile),
        "--headless",
        "-u",
        str(users),
        "-r",
        str(users),
        "-t",
        f"{seconds}s",
        "--host",
        host,
        "--only-summary",
        "--json-file",
        str(out / "locust"),
        "--results-dir",
        str(out),
        "--image-preset",
        "small",
        "--pool-size",
        "16",
        *args,
    ]
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True
    )
    try:
        stdout, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        stdout, _ = p.communicate()
    return subprocess.CompletedProcess(cmd, p.returncode, stdout, "")


def locust_request_count(out: Path) -> int:
    """Locust's own final count of requests (its --json-file stats, written at shutdown)."""
    return sum(e["num_requests"] for e in json.loads((out / "locust.json").read_text()))


def rows(out: Path):
    return read_table(out, "requests").to_pandas()


def locust_rows(df):
    """The rows of requests Locust counted: all but those cut by the end of the run (no Locust request)."""
    return df[df["outcome"] != schema.CUT]


ONLY = {f"--weight-{k.replace('_', '-')}": "0" for k in WEIGHTS}


def only(video_share: float = 0.0, **weights: int) -> list[str]:
    """Locust arguments for a mix of just these kinds, e.g. only(valid_image=3, malformed_post=1); the malformed
    requests and aborts carry images only, unless ``video_share`` says otherwise."""
    args = {
        **ONLY,
        **{f"--weight-{k.replace('_', '-')}": str(w) for k, w in weights.items()},
        "--video-share": str(video_share),
    }
    return [x for kv in args.items() for x in kv]
