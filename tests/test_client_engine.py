"""Our client on real vLLM (issue 11): vLLM answers oversized_image with 500 and closes the connection without
saying so; the requests after it on the same user are not failures of ours. And the README's headless command
against a server that stays up exits 0 (its gates hold)."""

from __future__ import annotations

import pytest
from locust_run import locust, locust_request_count, locust_rows, only, rows

from mmchaos import schema
from mmchaos.payloads import routes

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


def test_every_pooling_route_the_server_lists_is_sent_and_answered(fixed_server, tmp_path):
    """The route kinds on real vLLM: each of the seven routes 0.32.0 lists gets requests and answers them; the
    routes' own post-render failures get their statuses, and the images they leave are retried as the SDK does.
    Documents (2 to 40 pages, one input each) are answered too."""
    r = locust(
        "locustfiles/embeddings.py",
        fixed_server.base_url,
        tmp_path,
        *only(embed_v2=1, pooling=1, score=2, rerank=3, malformed_post=1, valid_image=1, document=1),
        "--malformed-cases",
        "v2_embed_output_dimension,score_truncate_zero",
        "--page-side",
        "512",
        "--max-requests",
        "120",
        users=3,
        seconds=240,
        timeout=360,
    )  # ends at 120 requests, however busy the machine
    df = locust_rows(rows(tmp_path))
    routed = df[df["kind"].isin(schema.ROUTE_KINDS) & df["final"]]
    assert set(routed["endpoint"]) == set(routes.PATHS), r.stdout[-2000:]
    assert (routed["outcome"] == schema.OK).all(), routed[routed["outcome"] != schema.OK]
    post = df[df["kind"] == "malformed_post"]
    got = post.groupby("case")["status"].agg(set).to_dict()
    assert got == {"v2_embed_output_dimension": {400}, "score_truncate_zero": {500}}, got
    docs = df[(df["kind"] == "document") & df["final"]]
    assert len(docs) >= 3 and (docs["outcome"] == schema.OK).all() and (docs["n_images"] >= 2).all()
    assert fixed_server.health()[0]
