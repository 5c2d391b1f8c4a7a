"""A crash is named by its chain of log signatures, root first (mmchaos.signatures: Signatures.chain), on log lines
as vLLM writes them: the chain of vLLM 0.30.0's crash is the drift warning, then the detokenizer assertion, whatever
else the traceback printed; an engine that asserts on the miss itself is another chain. No server."""

from __future__ import annotations

import pandas as pd
import pytest

from mmchaos.analysis import stats
from mmchaos.analysis.results import CampaignResults
from mmchaos.signatures import CHAIN_SEP, Signatures

SIGS = Signatures.load()

# vLLM 0.30.0 on the tiny model (`mmchaos repro --engine 0.30.0`, 2026-12-01), the lines around its death
V030_CRASH = """\
(APIServer pid=17311) INFO:     127.0.0.1:48870 - "POST /v1/embeddings HTTP/1.1" 400 Bad Request
(EngineCore pid=17509) WARNING 12-01 04:29:29 [core.py:1868] Multi-modal cache miss for request embd-8f069caf8aa5851a-0-b3cc002c (mm_hashes=['6181eb05bb93e51dfde44413e71d5d7341ed2f9a57cb398218d20ddf5a3cf4dd']): P0/P1 cache drift; returning a retryable response so the items are resent with data.
(APIServer pid=17311) ERROR 12-01 04:29:29 [async_llm.py:843] AsyncLLM output_handler failed.
(APIServer pid=17311) ERROR 12-01 04:29:29 [async_llm.py:843] Traceback (most recent call last):
(APIServer pid=17311) ERROR 12-01 04:29:29 [async_llm.py:843]   File ".../vllm/v1/engine/output_processor.py", line 696, in process_outputs
(APIServer pid=17311) ERROR 12-01 04:29:29 [async_llm.py:843]     assert req_state.detokenizer is not None
(APIServer pid=17311) ERROR 12-01 04:29:29 [async_llm.py:843] AssertionError
(APIServer pid=17311) INFO:     127.0.0.1:48878 - "POST /v1/embeddings HTTP/1.1" 500 Internal Server Error
"""
# an engine that asserts on the miss itself (the older mechanism), then dies
OLDER_CRASH = """\
(EngineCore_DP0 pid=9) ERROR [core.py:710] AssertionError: Expected a cached item for mm_hash='6181eb05bb93e51d'
(APIServer pid=7) ERROR [async_llm.py:480] EngineDeadError: EngineCore encountered an issue.
"""


def test_the_report_versions_crash_is_drift_then_the_assertion():
    matches = SIGS.scan(V030_CRASH)
    # the log's own order has the traceback's header between the two: a restatement of the same death
    assert [m.signature.name for m in matches] == ["cache_drift", "output_handler_failed", "detokenizer_assert"]
    assert SIGS.chain(matches) == "cache_drift → detokenizer_assert"
    assert SIGS.chain([m.signature.name for m in matches]) == "cache_drift → detokenizer_assert"  # names work too


def test_an_engine_asserting_on_the_miss_is_another_chain():
    chain = SIGS.chain(SIGS.scan(OLDER_CRASH))
    assert chain == "expected_cached_item"
    assert chain != SIGS.chain(SIGS.scan(V030_CRASH))
    # both mechanisms in one death: the root stays first
    both = SIGS.scan(OLDER_CRASH.splitlines()[0] + "\n" + V030_CRASH)
    assert SIGS.chain(both) == "expected_cached_item → cache_drift → detokenizer_assert"


@pytest.mark.parametrize(
    "names,crash,want",
    [
        ([], None, "unknown"),  # a death that said nothing
        (["cache_drift"], None, "cache_drift → unknown"),  # drift, then a silent death (SIGKILL, say)
        (["cache_drift", "cache_miss_503"], "hang", "cache_drift → cache_miss_503 → hang"),
        (["cache_drift", "cache_drift", "detokenizer_assert"], None, "cache_drift → detokenizer_assert"),
        (["oom", "engine_dead"], None, "oom"),
        (
            ["cache_drift", "detokenizer_assert", "cache_miss_503"],
            None,
            "cache_drift → detokenizer_assert",
        ),  # after: no cause
        (["no_such_signature", "engine_dead"], None, "engine_dead"),
    ],
)
def test_chain_rules(names, crash, want):
    assert SIGS.chain(names, crash) == want
    assert SIGS.chain(names, crash).split(CHAIN_SEP)[-1] == (crash or SIGS.chain(names).split(CHAIN_SEP)[-1])


def test_the_crash_table_groups_crashes_by_chain():
    crashes = pd.DataFrame(
        {
            "config": pd.Categorical(["a", "a", "a", "b"]),
            "trial": [0, 0, 1, 0],
            "signature": pd.Categorical(["detokenizer_assert", "detokenizer_assert", "detokenizer_assert", None]),
            "chain": ["cache_drift → detokenizer_assert", "expected_cached_item → detokenizer_assert", None, None],
            "reason": pd.Categorical(["process_exit"] * 3 + ["hang"]),
        }
    )
    c = CampaignResults(
        "x", None, ["a", "b"], pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), crashes
    )
    t = stats.crash_signatures(c)
    got = {(r.config, r.chain, r.reason): r.crashes for r in t.itertuples()}
    assert got == {
        ("a", "cache_drift → detokenizer_assert", "process_exit"): 1,
        ("a", "expected_cached_item → detokenizer_assert", "process_exit"): 1,
        ("a", "detokenizer_assert", "process_exit"): 1,  # recorded before chains: its signature
        ("b", "(unclassified)", "hang"): 1,
    }
