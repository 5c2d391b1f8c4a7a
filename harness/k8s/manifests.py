"""Kubernetes manifests for one configuration of a campaign: distributed Locust as it is run on a cluster.

``render`` is pure: a checked campaign plan in, multi-document YAML out (``mmchaos k8s`` prints it). It renders
a results volume, the campaign (rewritten for the cluster) in a ConfigMap, the campaign master (a Job running
``mmchaos campaign run`` with the Locust master inside, and a Service workers reach it by), N Locust workers (a
Deployment of ``mmchaos worker``) and an example vLLM server on 2 GPUs (a Deployment and a Service). Only the master
mounts the results volume: the workers send their rows to it over Locust's messages (locustfiles/plugin/shipping.py).
docs/kubernetes.md says how to use it; deploy/k8s/example.yaml is one rendering, kept current by tests/test_k8s.py.

The campaign runs in attach mode against the vLLM Service: the crash this suite provokes kills the server,
Kubernetes restarts it (restartPolicy Always) and the campaign sees both on /health. Secret values (``--api-key``,
env entries named like keys or tokens) never appear in the output: they are read from the Secret ``mmchaos-vllm``.
"""

from __future__ import annotations

import json
import re
import shlex

import yaml

from mmchaos.redact import API_KEY_FLAG, secret_env

from ..campaign.plan import CampaignPlan, Config
from ..servers.server import tensor_parallel_size

NAME = "mmchaos"
MASTER = "mmchaos-master"
WORKER = "mmchaos-worker"
VLLM = "mmchaos-vllm"
RESULTS = "mmchaos-results"
CAMPAIGN = "mmchaos-campaign"
SECRET = "mmchaos-vllm"  # created by the user (docs/kubernetes.md); never rendered
MODELS = "mmchaos-models"  # a claim holding the model, when the model is a path; the user's data, never rendered
MASTER_PORT = 5557
VLLM_PORT = 8000
VLLM_URL = f"http://{VLLM}:{VLLM_PORT}"
# the image's installed locustfile: the master must load the file the workers run (deploy/Dockerfile checks it)
LOCUSTFILE = "/usr/local/lib/python3.11/site-packages/mmchaos/locustfiles/embeddings.py"
USER_ID = 10001  # deploy/Dockerfile's user
PATH_OPTIONS = ("image_dir", "cases_file", "server_log")  # local paths: they do not exist in the pods
API_KEY_REF = "$(VLLM_API_KEY)"  # Kubernetes expands it in args from the container's env
VLLM_IMAGE, DEFAULT_VERSION = "vllm/vllm-openai", "0.30.0"  # vLLM's own server image; the report's version
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a namespace's name
QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")  # a storage size


def render(
    plan: CampaignPlan,
    config_name: str,
    *,
    workers: int,
    image: str,
    namespace: str = "mmchaos",
    results_size: str = "10Gi",
    vllm_image: str | None = None,
    model_path: str | None = None,
) -> str:
    cfg = _config(plan, config_name)
    vllm_image = vllm_image or f"{VLLM_IMAGE}:v{cfg.engine or DEFAULT_VERSION}"  # the configuration's version
    if workers < 1:
        raise ValueError("workers must be at least 1")
    if not DNS_LABEL.fullmatch(namespace):
        raise ValueError(f"namespace {namespace!r} is not a Kubernetes name (lower-case letters, digits, '-')")
    if not QUANTITY.fullmatch(results_size):
        raise ValueError(f"results size {results_size!r} is not a Kubernetes quantity, e.g. 10Gi")
    for what, name in (("image", image), ("vLLM image", vllm_image)):
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"the {what} {name!r} is not an image reference, e.g. registry.example.com/mmchaos:0.1.0")
    for name in PATH_OPTIONS:
        if plan.workload.options.get(name):
            raise ValueError(f"[workload.options] {name} is a local path the pods do not have: remove it")
    if not plan.workload.locustfile.endswith("embeddings.py"):
        raise ValueError(
            "the workers run mmchaos.locustfiles.embeddings: the campaign's locustfile must be embeddings.py"
        )
    model, base = _server_command(plan, model_path)
    base, base_key = _hide_api_key(base)
    flags, flags_key = _hide_api_key(cfg.flags)
    api_key = base_key or flags_key
    # one GPU per tensor-parallel rank; the configuration's flags come last, so vLLM takes their value
    stated = [a for a in (flags, base) if any(w.split("=", 1)[0] in ("--tensor-parallel-size", "-tp") for w in a)]
    if not stated:
        base += ["--tensor-parallel-size", "2"]  # the example server: 2 GPUs
    gpus = tensor_parallel_size(stated[0]) if stated else 2
    secret_keys = (["api-key"] if api_key else []) + list(secret_env(cfg.env))
    campaign = campaign_toml(plan, cfg, workers, flags)

    docs = [
        _pvc(namespace, results_size),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(CAMPAIGN, namespace, "campaign"),
            "data": {"campaign.toml": campaign},
        },
        _master_job(plan, cfg, namespace, image, api_key),
        _service(MASTER, namespace, "master", MASTER_PORT, "locust"),
        _workers(namespace, image, workers, api_key),
        _vllm(namespace, vllm_image, model, [*base, *flags], cfg.env, api_key, gpus, plan.crash.startup_timeout),
        _service(VLLM, namespace, "vllm", VLLM_PORT, "http"),
    ]
    return _header(plan, cfg, namespace, workers, image, model, secret_keys) + dump(docs)


def dump(docs: list[dict]) -> str:
    """Multi-document YAML as `mmchaos k8s` prints it."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=4096)


def config_of(plan: CampaignPlan, name: str) -> Config:
    return _config(plan, name)


def has_api_key(plan: CampaignPlan, cfg: Config) -> bool:
    """Whether the server is given an --api-key (the Secret then holds it, key api-key)."""
    base = shlex.split(plan.command) if plan.target == "command" else []
    return _hide_api_key(base)[1] or _hide_api_key(cfg.flags)[1]


def _config(plan: CampaignPlan, name: str) -> Config:
    for cfg in plan.configs:
        if cfg.name == name:
            return cfg
    raise ValueError(f"no configuration '{name}' in {plan.path.name}; have: {', '.join(c.name for c in plan.configs)}")


def _server_command(plan: CampaignPlan, model_path: str | None) -> tuple[str, list[str]]:
    """The model and the server flags every configuration shares: a command target's ``vllm serve MODEL ...``
    without its --host and --port (the Service fixes those); else ``--runner pooling`` (an embedding model)."""
    words = shlex.split(plan.command) if plan.target == "command" else []
    at = next((i for i, w in enumerate(words[:-1]) if w == "serve" and i and words[i - 1].endswith("vllm")), None)
    if at is None:
        base = ["--runner", "pooling"]
        model = model_path or plan.model
    else:
        model, rest, base = words[at + 1], words[at + 2 :], []
        model = model_path or (plan.model if model == "{model}" else model)
        skip = False
        for w in rest:
            if skip:
                skip = False
            elif w in ("--host", "--port"):
                skip = True
            elif not w.startswith(("--host=", "--port=")):
                base.append(w)
    if not model:
        raise ValueError(f"{plan.path.name} names no model the cluster can serve: pass --model")
    return model, base


def _hide_api_key(args) -> tuple[list[str], bool]:
    """``--api-key X`` and ``--api-key=X`` with X replaced by a reference to the Secret's value."""
    out, values, taking = [], set(), False
    for a in args:
        if taking and not a.startswith("-"):
            values.add(a)
            out.append(API_KEY_REF)
            continue
        taking = a == API_KEY_FLAG
        if a.startswith(API_KEY_FLAG + "="):
            values.add(a.split("=", 1)[1])
            a = f"{API_KEY_FLAG}={API_KEY_REF}"
        out.append(a)
    if len(values) > 1:
        raise ValueError("several --api-key values: the Secret holds one (key api-key)")
    return out, bool(values)


def campaign_toml(plan: CampaignPlan, cfg: Config, workers: int, flags: list[str]) -> str:
    """The campaign as the master runs it: attach to the vLLM Service, the installed locustfile, a Locust master
    on all interfaces waiting for the workers, and only this configuration (the server runs its flags; they are
    kept for the report, secrets as references)."""
    campaign = {
        "name": plan.name,
        "description": plan.description,
        "trials": plan.trials,
        "target": "attach",
        "url": VLLM_URL,
        "model": plan.model,
        "seed": plan.seed,
    }
    # the load comes from the worker pods (processes = 0: none beside the master in its own pod)
    workload = {
        **plan.workload.table(),
        "locustfile": LOCUSTFILE,
        "processes": 0,
        "expect_workers": workers,
        "master_bind_host": "*",
        "master_bind_port": MASTER_PORT,
    }
    if not workload.get("rate"):  # a closed loop says so by leaving the rate out (a rate of 0 is refused)
        workload.pop("rate", None)
    env = {k: f"<Secret {SECRET}, key {k}>" if k in secret_env(cfg.env) else v for k, v in cfg.env.items()}
    config = {"name": cfg.name, "description": cfg.description, "flags": flags, "env": env}
    lines = [
        f"# {plan.path.name}, configuration {cfg.name}, rewritten by `mmchaos k8s` for the cluster: attach to",
        "# the vLLM Service (Kubernetes restarts a crashed server), a Locust master for the mmchaos-worker pods.",
        "# Change the source file and render again rather than editing this.",
        "",
    ]
    for name, table in (("campaign", campaign), ("workload", workload), ("crash", plan.crash.model_dump())):
        lines += [*_toml_table(f"[{name}]", name, table), ""]
    return "\n".join([*lines, *_toml_table("[[config]]", "config", config)]) + "\n"


def _toml_table(head: str, name: str, data: dict) -> list[str]:
    inline = head.startswith("[[")  # in an array of tables, tables stay inline (env = {...})
    lines = [head] + [
        f"{_toml_key(k)} = {_toml(v)}" for k, v in data.items() if v is not None and (inline or not isinstance(v, dict))
    ]
    for k, v in data.items():
        if isinstance(v, dict) and v and not inline:
            lines += ["", *_toml_table(f"[{name}.{_toml_key(k)}]", f"{name}.{k}", v)]
    return lines


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string (ASCII, escaped) is a TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(map(_toml, v)) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


# --- the objects ---------------------------------------------------------------------------------------------


def labels(component: str) -> dict:
    return {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": component}


def _meta(name: str, namespace: str, component: str) -> dict:
    return {"name": name, "namespace": namespace, "labels": labels(component)}


def _secret_env(name: str, key: str) -> dict:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": SECRET, "key": key}}}


def _pvc(namespace: str, size: str) -> dict:
    # ReadWriteOnce: only the master writes (the workers send it their rows over Locust's messages)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(RESULTS, namespace, "results"),
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
    }


def _service(name: str, namespace: str, component: str, port: int, port_name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, namespace, component),
        "spec": {
            "selector": labels(component),
            "ports": [{"name": port_name, "port": port, "targetPort": port_name, "protocol": "TCP"}],
        },
    }


def _mmchaos_pod(container: dict, api_key: bool, volumes: list[dict], **spec) -> dict:
    """Pod spec of the master and the workers: the image's non-root user, a volume (the master's results) writable
    by it."""
    if api_key:
        container["env"] = [_secret_env("MMCHAOS_API_KEY", "api-key")]
    container["securityContext"] = {"allowPrivilegeEscalation": False}
    return {
        "enableServiceLinks": False,  # no <SERVICE>_PORT variables in the environment
        "securityContext": {"runAsNonRoot": True, "runAsUser": USER_ID, "runAsGroup": USER_ID, "fsGroup": USER_ID},
        **spec,
        "containers": [container],
        **({"volumes": volumes} if volumes else {}),
    }


def _master_job(plan: CampaignPlan, cfg: Config, namespace: str, image: str, api_key: bool) -> dict:
    master = {
        "name": "master",
        "image": image,
        "command": ["mmchaos"],
        "args": ["campaign", "run", "/campaign/campaign.toml", "--out", "/results"],
        "ports": [{"name": "locust", "containerPort": MASTER_PORT}],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
        "volumeMounts": [
            {"name": "results", "mountPath": "/results"},
            {"name": "campaign", "mountPath": "/campaign", "readOnly": True},
        ],
    }
    # the campaign's preflight fails at once if the server is not up yet: a large model loads for minutes
    wait = {
        "name": "wait-for-vllm",
        "image": image,
        "command": ["python", "-c", _WAIT_FOR_VLLM],
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    meta = _meta(MASTER, namespace, "master")
    meta["annotations"] = {"mmchaos/campaign": plan.name, "mmchaos/config": cfg.name}
    pod = _mmchaos_pod(
        master,
        api_key,
        [
            {"name": "results", "persistentVolumeClaim": {"claimName": RESULTS}},
            {"name": "campaign", "configMap": {"name": CAMPAIGN}},
        ],
        restartPolicy="Never",
        initContainers=[wait],
    )
    # no retries: the exit code is the campaign's verdict; delete the Job and apply again to resume
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": labels("master")}, "spec": pod}},
    }


_WAIT_FOR_VLLM = (
    "import time, urllib.request\n"
    "while True:\n"
    "    try:\n"
    f"        urllib.request.urlopen('{VLLM_URL}/health', timeout=5)\n"
    "        break\n"
    "    except Exception as e:\n"
    "        print('waiting for vLLM:', e, flush=True)\n"
    "        time.sleep(10)\n"
)


def _workers(namespace: str, image: str, workers: int, api_key: bool) -> dict:
    worker = {
        "name": "worker",
        "image": image,
        "command": ["mmchaos"],
        "args": ["worker", "--master-host", MASTER, "--master-port", str(MASTER_PORT)],
        # one Locust worker is one process on one core
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}},
    }
    # `mmchaos worker` joins the master's runs (one per trial) one after the other; no volume: its rows go to the
    # master. A worker that could not hand rows over writes them to the pod's own disk and logs it.
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(WORKER, namespace, "worker"),
        "spec": {
            "replicas": workers,
            "selector": {"matchLabels": labels("worker")},
            "template": {
                "metadata": {"labels": labels("worker")},
                "spec": _mmchaos_pod(worker, api_key, [], restartPolicy="Always"),
            },
        },
    }


def _vllm(
    namespace: str,
    image: str,
    model: str,
    flags: list[str],
    env: dict,
    api_key: bool,
    gpus: int,
    startup_timeout: float,
) -> dict:
    envs = [_secret_env("VLLM_API_KEY", "api-key")] if api_key else []
    envs += [_secret_env(k, k) if k in secret_env(env) else {"name": k, "value": v} for k, v in env.items()]
    # tensor parallel workers share memory through /dev/shm
    mounts: list[dict[str, str | bool]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}]
    if model.startswith("/"):
        mounts.append({"name": "models", "mountPath": model.rsplit("/", 1)[0] or "/", "readOnly": True})
        volumes.append({"name": "models", "persistentVolumeClaim": {"claimName": MODELS, "readOnly": True}})
    probe = {"httpGet": {"path": "/health", "port": "http"}, "timeoutSeconds": 5}
    container = {
        "name": "vllm",
        "image": image,
        "command": ["vllm", "serve"],
        "args": [model, "--host", "0.0.0.0", "--port", str(VLLM_PORT), *flags],
        "env": envs,
        "ports": [{"name": "http", "containerPort": VLLM_PORT}],
        "resources": {
            "requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": str(gpus)},
            "limits": {"memory": "64Gi", "nvidia.com/gpu": str(gpus)},
        },
        # loading may take as long as the campaign allows a start; after that, a hang is restarted in 30 s
        "startupProbe": {**probe, "periodSeconds": 10, "failureThreshold": max(1, -(-int(startup_timeout) // 10))},
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        "volumeMounts": mounts,
    }
    if not envs:
        del container["env"]
    pod = {
        "enableServiceLinks": False,
        # the crash this suite provokes kills the server: Kubernetes restarts it, the campaign sees it on /health
        "restartPolicy": "Always",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
        "volumes": volumes,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(VLLM, namespace, "vllm"),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # never two servers on the same GPUs
            "selector": {"matchLabels": labels("vllm")},
            "template": {"metadata": {"labels": labels("vllm")}, "spec": pod},
        },
    }


def _header(
    plan: CampaignPlan, cfg: Config, namespace: str, workers: int, image: str, model: str, secret_keys: list[str]
) -> str:
    lines = [
        f"Rendered by: mmchaos k8s {plan.path.name} --config {cfg.name} --workers {workers} --image {image}",
        f"Campaign {plan.name}, configuration {cfg.name}: a master Job runs it in attach mode against the",
        f"{VLLM} Service with {workers} Locust worker{'s' * (workers != 1)}. See docs/kubernetes.md.",
        f"Needs: a volume for {RESULTS} (ReadWriteOnce: only the master writes; the workers send it their rows",
        "over Locust's messages), nodes with nvidia.com/gpu.",
    ]
    if model.startswith("/"):
        lines.append(f"The model {model} is read from the PersistentVolumeClaim {MODELS} (yours to create).")
    if plan.faults:
        lines.append(
            f"The campaign's {len(plan.faults)} fault(s) are not in it: `mmchaos k8s ... --faults` prints them as a "
            "Chaos Mesh Workflow to apply when the load starts."
        )
    if secret_keys:
        literals = " ".join(f"--from-literal={k}=..." for k in secret_keys)
        lines += [
            "Secret values are not in this file: they are read from the Secret " + SECRET + ". Create it first:",
            f"  kubectl -n {namespace} create secret generic {SECRET} {literals}",
        ]
    return "".join(f"# {ln}\n" for ln in lines)


class _Dumper(yaml.SafeDumper):
    """safe_dump_all's dumper, with multi-line strings (the campaign file, the wait script) as literal blocks and
    no anchors (a reader of the manifests should not have to resolve *id001)."""

    def ignore_aliases(self, data) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, s: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


_Dumper.add_representer(str, _str)
