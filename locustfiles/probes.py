"""Deterministic probes: named sequences that each use a never-seen image, step by step, every step a row.

    locust -f locustfiles/probes.py --host http://127.0.0.1:8000 --headless -u 1 -t 30s

Sequences (``--probe-sequences``, comma-separated; default all, in turn): mmchaos/probe_sequences.py's.
A failed step is retried as ``--retry-policy`` says (a 503 cache miss on the reuse step, with the default openai
policy), each attempt its own row.
Rows: kind "probe", probe = the sequence, case = the step.
"""

from __future__ import annotations

from dataclasses import replace

from locust import constant, events, task

from mmchaos import probe_sequences
from mmchaos.locustfiles.plugin import listeners as plugin
from mmchaos.locustfiles.plugin.chaos_user import ChaosUser
from mmchaos.payloads import bodies as build
from mmchaos.payloads import catalogue, fresh, malformed
from mmchaos.payloads.shared_pool import shared_pool

plugin.register()

POISON_CASE = "dimensions_unsupported"  # the report's measured post-render 400
ROUTE_POISON_CASE = "v2_embed_output_dimension"  # the same on Cohere's /v2/embed


@events.init_command_line_parser.add_listener
def _options(parser):
    parser.add_argument(
        "--probe-sequences",
        type=str,
        default=",".join(probe_sequences.NAMES),
        help="comma-separated probe sequences: "
        + "; ".join(f"{s.name} ({s.about})" for s in probe_sequences.SEQUENCES.values()),
    )


def _as_probe(req: build.BuiltRequest, step: str, expected: int | None = None) -> build.BuiltRequest:
    return req._replace(meta=replace(req.meta, kind="probe", case=step, expected_status=expected))


class ProbeUser(ChaosUser):
    wait_time = constant(0)

    def on_start(self):
        o = self.environment.parsed_options
        self.sequences = probe_sequences.parse(o.probe_sequences)
        self.pool = shared_pool(n=8, seed=o.image_seed, preset="small")
        cases = catalogue.load_cases()
        self.poison, self.route_poison = cases[POISON_CASE], cases[ROUTE_POISON_CASE]
        self.n = 0

    def _fresh(self):
        self.n += 1
        return fresh.fresh_image(
            self.pool[self.n % len(self.pool)], f"probe-{self.worker_index}-{self.user_id}-{self.n}"
        )

    def _reuse(self, seq: str, image, model: str, ins) -> None:
        self.send(_as_probe(build.image_request(model, image, "probe", instruction=ins), "reuse"), probe=seq)

    @task
    def run_sequence(self):
        o = self.environment.parsed_options
        seq = self.sequences[self.n % len(self.sequences)]
        image, model, ins = self._fresh(), o.model, o.instruction or None
        first = probe_sequences.SEQUENCES[seq].first_step
        if seq in ("poison_reuse", "route_poison_reuse"):
            case = self.poison if seq == "poison_reuse" else self.route_poison
            req = malformed.build_malformed_request(case, image, model, instruction=ins)
            self.send(_as_probe(req, first, case.expected_status), probe=seq)
        elif seq == "tokenize_reuse":
            self.send(_as_probe(build.tokenize_request(model, image, "probe", instruction=ins), first), probe=seq)
        else:
            req = build.image_request(model, image, "probe", instruction=ins)
            self.send(_as_probe(req, first), abort=True, probe=seq)
        self._reuse(seq, image, model, ins)
