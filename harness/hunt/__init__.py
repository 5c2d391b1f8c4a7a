"""`mmchaos hunt`, its own room: a search for failures nobody listed, driven by the server's own API.

- search.py: the loop (servers, cases, budgets, the state a re-run resumes);
- reproducers.py: once the search ends, each finding made reproducible (crashes shrunk, hangs confirmed alone);
- cases.py: a case, a Hypothesis state machine whose rules are requests and operator actions;
- api_schema.py, bodies.py, media.py: what a case sends, from the server's /openapi.json, and its images and clips;
- negative.py: bodies just off a route's schema (one thing made wrong);
- oracles.py, reference.py: what counts as a failure (a crash, a log line nobody named, a 5xx, a wrong answer);
- findings.py: a finding, typed; report.py: the findings report; versions.py: reproducers on other versions;
- lives.py: a server's life as kept (its cases and answers) and as the trace reproducers and the minimizer replay;
- coverage.py, corpus.py: vLLM's own lines as the search's compass, the cases that taught it something, mutants;
- axis.py, flag_draw.py: server flags as an axis of the search, and flag sets drawn from vLLM's own help.
"""
