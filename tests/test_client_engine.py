"""Our client on real vLLM (issue 11): vLLM answers oversized_image with 500 and closes the connection without
saying so; the requests after it on the same user are not failures of ours. And the README's headless command
against a server that stays up exits 0 (its gates hold)."""

from __future__ import annotations

import pytest
from locust_run import locust, locust_request_count, locust_rows, only, rows

from mmchaos import schema

pytestmark = pytest.mark.engine


def test_valid_requests_after_a_500_on_the_same_user_are_not_connection_errors(fixed_server, tmp_path):
    # no retries: each request follows the 500 at once, on the connection vLLM is closing
    r = locust(
        "locustfiles/embeddings.py",
        fixed_server.base_url,
        tmp_path,
        *only(valid_image=1, malformed_pre=1),
        "--malformed-cases",
        "oversized_image",
        "--retry-policy",
        "none",
        "--max-requests",
        "60",
        users=2,
        seconds=180,
        timeout=300,
    )  # ends at 60 requests, however busy the machine
    df = locust_rows(rows(tmp_path))
    pre = df[df["kind"] == "malformed_pre"]
    assert len(pre) > 10 and (pre["status"] == 500).all(), r.stdout[-2000:]
    assert (df["outcome"] != schema.CONNECTION_ERROR).all(), df[df["outcome"] == schema.CONNECTION_ERROR]
    assert (df.loc[df["kind"] == "valid_image", "outcome"] == schema.OK).all()
    assert len(df) == locust_request_count(tmp_path)
    assert r.returncode == 0, r.stdout[-2000:]


def test_the_readme_headless_command_against_a_surviving_server_exits_0(fixed_server, tmp_path):
    r = locust(
        "locustfiles/embeddings.py",
        fixed_server.base_url,
        tmp_path,
        "--max-requests",
        "150",
        users=4,
        seconds=180,
        timeout=300,
    )  # ends at 150 requests, however busy the machine
    assert r.returncode == 0, r.stdout[-3000:]
    assert "gate failed" not in r.stdout
    df = locust_rows(rows(tmp_path))
    valid = df[df["kind"].isin(schema.VALID_KINDS) & df["final"]]
    assert len(valid) > 30 and (valid["outcome"] == schema.OK).all()  # every valid request succeeded in the end
