"""The Kubernetes manifests (harness/k8s/manifests.py), checked offline: no cluster, only the Kubernetes API schemas
that kubernetes-validate ships. `python tests/test_k8s.py` rewrites deploy/k8s/example.yaml."""

from __future__ import annotations

import dataclasses
import json
import sys
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from mmchaos import faults
from mmchaos.harness import cli
from mmchaos.harness.campaign import plan as campaign_plan
from mmchaos.harness.campaign.plan import Config
from mmchaos.harness.k8s import chaos_mesh
from mmchaos.harness.k8s import manifests as k8s

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "campaigns" / "gpu-template.toml"
EXAMPLE = ROOT / "deploy" / "k8s" / "example.yaml"
FAULTS_EXAMPLE = ROOT / "deploy" / "k8s" / "faults-example.yaml"
WORKFLOW_SCHEMA = ROOT / "tests" / "schemas" / "chaos-mesh-workflow.json"  # Chaos Mesh's CRD (trim_crd.py)
EXAMPLE_ARGS = {"config_name": "cache-off", "workers": 4, "image": "registry.example.com/mmchaos:0.1.0"}
K8S_VERSION = kubernetes_validate.latest_version()  # the newest Kubernetes whose schemas the package ships
API_KEY, HF_TOKEN = "sk-test-4f9a2c7e1b3d", "hf_test_8e2d6b0a9c1f"


def template() -> campaign_plan.CampaignPlan:
    return campaign_plan.load(TEMPLATE, check_flags=False)


def render_example() -> str:
    return k8s.render(template(), **EXAMPLE_ARGS)


def with_secrets(api_key_flags: tuple[str, ...]) -> str:
    """The template with one configuration that carries an API key and a Hugging Face token."""
    cfg = Config(
        "keyed",
        None,
        ("--mm-processor-cache-gb", "0", *api_key_flags),
        {"HF_TOKEN": HF_TOKEN, "VLLM_LOGGING_LEVEL": "INFO"},
    )
    return k8s.render(dataclasses.replace(template(), configs=[cfg]), "keyed", workers=2, image="mmchaos:test")


# one fault of each kind Chaos Mesh can take, at seconds of load
FAULTS = [
    faults.Fault("kill", "tp_worker", 1, at=60),
    faults.Fault("latency", at=10, duration=10, params={"latency_ms": 200, "jitter_ms": 50}),
    faults.Fault("bandwidth", at=15, duration=5, params={"kbps": 50}),
    faults.Fault("reset", at=20, duration=5, params={"after_bytes": 200}),
    faults.Fault("silence", at=25, duration=5),
    faults.Fault("slow_read", at=30, duration=5, params={"kbps": 5}),
    faults.Fault("pause", at=40, duration=5),
    faults.Fault("reset_mm_cache", at=50),
]


def with_faults(fs=FAULTS, flags: tuple[str, ...] = ()) -> campaign_plan.CampaignPlan:
    plan = template()
    cfg = dataclasses.replace(plan.configs[0], flags=(*plan.configs[0].flags, *flags))
    return dataclasses.replace(plan, configs=[cfg], faults=list(fs))


def render_faults_example() -> str:
    plan = with_faults()
    return chaos_mesh.render(plan, plan.configs[0].name)


def docs(text: str) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text)}


def container(doc: dict) -> dict:
    (c,) = doc["spec"]["template"]["spec"]["containers"]
    return c


def env_of(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


@pytest.mark.integration
def test_the_committed_example_is_the_current_rendering():
    assert EXAMPLE.read_text() == render_example(), "stale: rewrite it with `.venv/bin/python tests/test_k8s.py`"


@pytest.mark.parametrize("which", ["example", "with secrets"])
def test_every_document_is_valid_kubernetes(which):
    text = render_example() if which == "example" else with_secrets(("--api-key", API_KEY))
    kinds = []
    for doc in yaml.safe_load_all(text):
        # strict: an unknown field (a typo) is an error, as `kubectl apply` would report it
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        kinds.append(doc["kind"])
    assert sorted(kinds) == [
        "ConfigMap",
        "Deployment",
        "Deployment",
        "Job",
        "PersistentVolumeClaim",
        "Service",
        "Service",
    ]


@pytest.mark.parametrize("name", [c.name for c in template().configs])
def test_vllm_runs_the_configuration_flags_verbatim(name):
    plan = template()
    cfg = next(c for c in plan.configs if c.name == name)
    vllm = container(docs(k8s.render(plan, name, workers=1, image="mmchaos:test"))["Deployment", k8s.VLLM])
    argv = vllm["command"] + vllm["args"]
    assert argv[:7] == ["vllm", "serve", "/models/Qwen3-VL-Embedding-8B", "--host", "0.0.0.0", "--port", "8000"]
    assert argv[len(argv) - len(cfg.flags) :] == list(cfg.flags)
    assert "--runner" in argv and "{port}" not in argv  # the command's own flags, not its placeholders
    assert {k: e["value"] for k, e in env_of(vllm).items()} == cfg.env
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert vllm[probe]["httpGet"]["path"] == "/health"


@pytest.mark.parametrize("api_key_flags", [("--api-key", API_KEY), (f"--api-key={API_KEY}",)])
def test_secret_values_are_never_rendered_but_referenced(api_key_flags):
    text = with_secrets(api_key_flags)
    assert API_KEY not in text and HF_TOKEN not in text
    d = docs(text)
    vllm = container(d["Deployment", k8s.VLLM])
    ref = {"name": k8s.SECRET, "key": "api-key"}
    assert env_of(vllm)["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"] == ref
    assert env_of(vllm)["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": k8s.SECRET, "key": "HF_TOKEN"}
    assert env_of(vllm)["VLLM_LOGGING_LEVEL"] == {"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}
    assert "$(VLLM_API_KEY)" in " ".join(vllm["args"])  # Kubernetes puts the Secret's value there
    # the clients need the key too: the master (its watchers) and the workers (the requests)
    for kind, name in (("Job", k8s.MASTER), ("Deployment", k8s.WORKER)):
        assert env_of(container(d[kind, name]))["MMCHAOS_API_KEY"]["valueFrom"]["secretKeyRef"] == ref
    assert f"create secret generic {k8s.SECRET} --from-literal=api-key=... --from-literal=HF_TOKEN=..." in text


def test_the_pieces_reach_each_other():
    d = docs(k8s.render(template(), "shm-cache", workers=7, image="mmchaos:test", namespace="load"))
    assert all(doc["metadata"]["namespace"] == "load" for doc in d.values())
    assert all(doc["metadata"]["labels"]["app.kubernetes.io/name"] == "mmchaos" for doc in d.values())
    for svc, kind in ((k8s.MASTER, "Job"), (k8s.VLLM, "Deployment")):
        labels = d[kind, svc]["spec"]["template"]["metadata"]["labels"]
        assert d["Service", svc]["spec"]["selector"].items() <= labels.items()
    campaign = tomllib.loads(d["ConfigMap", k8s.CAMPAIGN]["data"]["campaign.toml"])
    master_port = d["Service", k8s.MASTER]["spec"]["ports"][0]["port"]
    vllm_port = d["Service", k8s.VLLM]["spec"]["ports"][0]["port"]
    assert campaign["campaign"]["url"] == f"http://{k8s.VLLM}:{vllm_port}"
    assert campaign["workload"]["master_bind_port"] == master_port
    workers = d["Deployment", k8s.WORKER]
    assert workers["spec"]["replicas"] == campaign["workload"]["expect_workers"] == 7
    assert container(workers)["args"] == ["worker", "--master-host", k8s.MASTER, "--master-port", str(master_port)]
    master = container(d["Job", k8s.MASTER])
    assert master["command"] + master["args"] == [
        "mmchaos",
        "campaign",
        "run",
        "/campaign/campaign.toml",
        "--out",
        "/results",
    ]
    assert {"name": "campaign", "mountPath": "/campaign", "readOnly": True} in master["volumeMounts"]
    # only the master writes results: the workers send it their rows over Locust's messages
    volumes = d["Job", k8s.MASTER]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "results", "persistentVolumeClaim": {"claimName": k8s.RESULTS}} in volumes
    assert {"name": "results", "mountPath": "/results"} in master["volumeMounts"]
    assert d["PersistentVolumeClaim", k8s.RESULTS]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "volumes" not in workers["spec"]["template"]["spec"] and "volumeMounts" not in container(workers)
    assert campaign["workload"]["processes"] == 0  # the load comes from the worker pods


@pytest.mark.integration
def test_the_cluster_campaign_is_the_configuration_in_attach_mode(tmp_path):
    plan = template()
    text = docs(render_example())["ConfigMap", k8s.CAMPAIGN]["data"]["campaign.toml"]
    raw = tomllib.loads(text)
    assert raw["campaign"]["target"] == "attach" and "command" not in raw["campaign"]
    assert raw["workload"]["locustfile"] == k8s.LOCUSTFILE
    assert raw["workload"]["options"] == plan.workload.options
    cfg = next(c for c in plan.configs if c.name == "cache-off")
    assert [c["name"] for c in raw["config"]] == ["cache-off"]
    assert raw["config"][0]["flags"] == list(cfg.flags) and "--mm-processor-cache-gb" in cfg.flags
    # the master's own check of the file (the image's locustfile exists only in the image)
    local = tmp_path / "campaign.toml"
    local.write_text(text.replace(k8s.LOCUSTFILE, str(ROOT / "locustfiles" / "embeddings.py")))
    cluster = campaign_plan.load(local)
    assert (cluster.target, cluster.url, cluster.trials) == ("attach", k8s.VLLM_URL, plan.trials)
    assert cluster.workload.expect_workers == EXAMPLE_ARGS["workers"]
    assert [(c.name, c.flags, c.env) for c in cluster.configs] == [("cache-off", cfg.flags, {})]
    assert (cluster.workload.master_bind_host, cluster.workload.master_bind_port) == ("*", k8s.MASTER_PORT)


def test_the_server_image_is_the_configuration_version():
    d = docs(k8s.render(template(), "v0.32-defaults", workers=1, image="mmchaos:test"))
    assert container(d["Deployment", k8s.VLLM])["image"] == "vllm/vllm-openai:v0.32.0"
    d = docs(k8s.render(template(), "v0.32-defaults", workers=1, image="mmchaos:test", vllm_image="my/vllm:dev"))
    assert container(d["Deployment", k8s.VLLM])["image"] == "my/vllm:dev"


def mmchaos(*args: str) -> int:
    """The command's exit code (argparse's own errors exit)."""
    try:
        return cli.main(list(args))
    except SystemExit as e:
        return e.code


def test_the_command_prints_the_rendering_and_refuses_bad_input_in_one_line(capsys):
    assert (
        mmchaos("k8s", str(TEMPLATE), "--config", "cache-off", "--workers", "4", "--image", EXAMPLE_ARGS["image"]) == 0
    )
    assert capsys.readouterr().out == render_example()
    for bad in (
        ["--config", "nope", "--workers", "1"],
        ["--config", "cache-off", "--workers", "0"],
        ["--config", "cache-off", "--workers", "1", "--namespace", "Bad_NS"],
        ["--config", "cache-off", "--workers", "1", "--results-size", "lots"],
    ):
        assert mmchaos("k8s", str(TEMPLATE), "--image", "x", *bad) == 2, bad
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_what_the_cluster_cannot_have_is_refused():
    plan = template()
    with pytest.raises(ValueError, match="no configuration 'nope'"):
        k8s.render(plan, "nope", workers=1, image="x")
    paths = plan.workload.model_copy(update={"options": {"image_dir": "/home/me/images"}})
    local = dataclasses.replace(plan, workload=paths)
    with pytest.raises(ValueError, match="image_dir"):
        k8s.render(local, "cache-off", workers=1, image="x")


def test_faults_are_one_chaos_mesh_workflow_valid_against_its_crd():
    text = render_faults_example()
    assert FAULTS_EXAMPLE.read_text() == text, "run: python tests/test_k8s.py"
    [wf] = yaml.safe_load_all(text)
    jsonschema.Draft7Validator(json.loads(WORKFLOW_SCHEMA.read_text())).validate(wf)
    templates = {t["name"]: t for t in wf["spec"]["templates"]}
    assert len(templates) == len(wf["spec"]["templates"]), "two templates share a name"
    assert all(c in templates for t in templates.values() for c in t.get("children", []))
    entry = templates[wf["spec"]["entry"]]
    assert entry["templateType"] == "Parallel" and len(entry["children"]) == len(FAULTS)
    kinds = {}
    for f, branch in zip(FAULTS, entry["children"]):
        wait, *steps = (templates[c] for c in templates[branch]["children"])
        assert wait["templateType"] == "Suspend" and wait["deadline"] == f"{f.at:g}s"  # due at its time
        kinds[f.kind] = steps
    vllm = {"app.kubernetes.io/name": "mmchaos", "app.kubernetes.io/component": "vllm"}
    [kill] = kinds["kill"]
    assert kill["podChaos"]["action"] == "container-kill" and kill["podChaos"]["selector"]["labelSelectors"] == vllm
    assert kinds["latency"][0]["networkChaos"]["delay"] == {"latency": "200ms", "jitter": "50ms"}
    assert kinds["latency"][0]["deadline"] == "10s"  # it lasts its duration
    assert kinds["bandwidth"][0]["networkChaos"]["bandwidth"]["rate"] == "400kbps"  # 50 kB/s in bits
    assert kinds["silence"][0]["networkChaos"]["action"] == "partition"
    assert kinds["reset"][0]["httpChaos"]["abort"] is True
    do, hold, undo = kinds["pause"]
    assert do["task"]["container"]["command"][-1] == f"{k8s.VLLM_URL}/pause?mode=abort"
    assert hold["deadline"] == "5s" and undo["task"]["container"]["command"][-1] == f"{k8s.VLLM_URL}/resume"
    assert len(kinds["reset_mm_cache"]) == 1  # at once: nothing to undo
    # the Service the tasks call is the one the manifests define
    assert ("Service", k8s.VLLM) in docs(render_example())


def test_a_keyed_server_gets_its_operator_calls_keyed_from_the_secret():
    text = chaos_mesh.render(with_faults(flags=("--api-key", API_KEY)), "defaults")
    assert API_KEY not in text
    [wf] = yaml.safe_load_all(text)
    jsonschema.Draft7Validator(json.loads(WORKFLOW_SCHEMA.read_text())).validate(wf)
    task = next(t for t in wf["spec"]["templates"] if t["templateType"] == "Task")["task"]["container"]
    assert '--oauth2-bearer "$VLLM_API_KEY"' in task["command"][-1]
    assert task["env"][0]["valueFrom"]["secretKeyRef"] == {"name": k8s.SECRET, "key": "api-key"}


def test_faults_chaos_mesh_cannot_run_are_refused_in_one_line():
    for fault, needle in (
        (faults.Fault("kill", "engine_core", after_requests=40), "runs on the clock"),
        (faults.Fault("stop", "tp_worker", 1, at=5, duration=5), "cannot stall one process"),
    ):
        with pytest.raises(ValueError, match=needle):
            chaos_mesh.render(with_faults([fault]), "defaults")
    with pytest.raises(ValueError, match="no \\[\\[fault\\]\\] table"):
        chaos_mesh.render(template(), "cache-off")


def test_the_schema_is_strict_a_misspelt_field_fails():
    [wf] = yaml.safe_load_all(render_faults_example())
    wf["spec"]["templates"][-1]["deadlin"] = "5s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(json.loads(WORKFLOW_SCHEMA.read_text())).validate(wf)


if __name__ == "__main__":
    EXAMPLE.parent.mkdir(parents=True, exist_ok=True)
    EXAMPLE.write_text(render_example())
    FAULTS_EXAMPLE.write_text(render_faults_example())
    print(f"wrote {EXAMPLE} and {FAULTS_EXAMPLE}", file=sys.stderr)
