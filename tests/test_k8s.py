"""The Kubernetes manifests (harness/k8s.py), checked offline: no cluster, only the Kubernetes API schemas that
kubernetes-validate ships. `python tests/test_k8s.py` rewrites deploy/k8s/example.yaml."""

from __future__ import annotations

import dataclasses
import sys
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from mmchaos.harness import campaign_plan, cli, k8s
from mmchaos.harness.campaign_plan import Config

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "campaigns" / "gpu-template.toml"
EXAMPLE = ROOT / "deploy" / "k8s" / "example.yaml"
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
        "--results",
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


if __name__ == "__main__":
    EXAMPLE.parent.mkdir(parents=True, exist_ok=True)
    EXAMPLE.write_text(render_example())
    print(f"wrote {EXAMPLE}", file=sys.stderr)
