"""Kubernetes manifests for a spec: ``tritonforge generate SPEC --k8s DIR``.

Plain manifests, not a Helm chart: every value is derived from the spec here, in Python, so
the output is the exact set of objects that gets applied, validated offline before it is
written (the Kubernetes OpenAPI schemas shipped in ``kubernetes-validate``, and the CRD
schemas kept in ``k8s_schemas/``), byte-identical for the same spec, and reviewable in a
diff. Templates (``templates/k8s/``) only lay the values out; every value goes through the
``json`` filter (a JSON scalar is a YAML flow scalar), so no spec string changes the YAML's
structure.

What is emitted (``DIR/``; ``kubectl apply -f DIR`` applies it, the adapter rules live in a
subfolder so that ``apply`` does not see them):

* ``model-repository.yaml``: a ConfigMap holding the generated model repository, file for
  file (the same bytes ``generate --output`` writes), mounted where the server reads it;
* ``server.yaml``: a Deployment (``parallelism.nodes == 1``) or a LeaderWorkerSet (multi-pod:
  TensorRT-LLM MPI leader/workers, or a vLLM Ray head/workers), GPUs per pod
  ``tensor_parallel_size * pipeline_parallel_size / nodes``, readiness ``/v2/health/ready``,
  liveness ``/v2/health/live``, a startup probe that covers engine load; the OpenAI gateway
  (``tritonforge gateway``) runs beside the server in the same (leader) pod;
* ``service.yaml`` (HTTP, gRPC, metrics, the OpenAI gateway), ``servicemonitor.yaml``,
  ``pdb.yaml``, ``hpa.yaml`` (``autoscaling/v2``, on a custom per-pod metric),
  ``rbac.yaml`` (TensorRT-LLM multi-node only: the leader runs ``kubectl exec`` as MPI's
  remote shell), ``launch.yaml`` (multi-node only: the leader/worker scripts);
* ``prometheus-adapter/config.yaml``: the prometheus-adapter discovery rules that turn the
  engine's own gauges into the custom metric the HPA reads.

Secrets are referenced by name (``<name>-secrets``, keys in :data:`SECRET_KEYS`), never
written: create the Secret yourself (see docs/scaling.md).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path, PurePosixPath
from typing import Any, Final

import jinja2
import yaml

from tritonforge.render.commands import (
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    Word,
    launch_commands,
    world_size,
)
from tritonforge.render.escape import json_text, sh_quote
from tritonforge.render.renderer import _tidy
from tritonforge.spec.model import Spec
from tritonforge.triton_models import metrics as engine_metrics

__all__ = [
    "ADAPTER_CONFIG",
    "CRD_SCHEMAS",
    "GATEWAY_PORT",
    "KUBERNETES_VERSION",
    "SECRET_KEYS",
    "K8sOptions",
    "K8sProblem",
    "adapter_rules",
    "dns_name",
    "load_objects",
    "render_k8s",
    "validate_k8s",
]

# The Kubernetes release whose OpenAPI schemas (from kubernetes-validate) the output must pass.
KUBERNETES_VERSION: Final = "1.33.0"
# The OpenAI gateway's port (the default of ``tritonforge gateway --port``).
GATEWAY_PORT: Final = 8080
# Where the pod reads the generated repository (not /models: model folders often live there).
REPOSITORY_MOUNT: Final = "/srv/tritonforge/model_repository"
LAUNCH_MOUNT: Final = "/srv/tritonforge/launch"
CACHE_MOUNT: Final = "/var/cache/tritonforge"
# Secret keys (in the Secret ``<name>-secrets``) and the environment variables they fill.
SECRET_KEYS: Final[dict[str, str]] = {
    "admin-key": "TRITONFORGE_ADMIN_KEY",
    "openai-api-key": "TRITONFORGE_OPENAI_API_KEY",
    "grafana-admin-password": "GF_SECURITY_ADMIN_PASSWORD",
}
# Grafana: the same image and dashboard as compose.yaml; Prometheus as prometheus-operator
# names its service (pkg/prometheus/server/statefulset.go: governingServiceName).
GRAFANA_IMAGE: Final = "grafana/grafana:11.2.2"
GRAFANA_PORT: Final = 3000
DEFAULT_PROMETHEUS_URL: Final = "http://prometheus-operated:9090"
GRAFANA_DATASOURCE_UID: Final = "tritonforge-prometheus"  # what the dashboard refers to
ADAPTER_CONFIG: Final = "prometheus-adapter/config.yaml"
_SCHEMAS: Final = Path(__file__).with_name("k8s_schemas")
# (apiVersion, kind) -> schema file kept in the project (CRDs the core schemas lack).
CRD_SCHEMAS: Final[dict[tuple[str, str], str]] = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset-v1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1.json",
}
# LeaderWorkerSet's own names (github.com/kubernetes-sigs/lws v0.10.0,
# api/leaderworkerset/v1/leaderworkerset_types.go).
LWS_NAME_LABEL: Final = "leaderworkerset.sigs.k8s.io/name"
LWS_WORKER_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/worker-index"
# Triton's Python backend keeps tensors in /dev/shm: a memory-backed volume, not the
# container runtime's 64 MiB default.
SHM_SIZE: Final = "16Gi"
RAY_PORT: Final = 6379
# TensorRT-LLM backend gauge (tensorrtllm_backend custom_metrics_reporter: label
# request_type in active/max/scheduled/context/waiting).
TRTLLM_REQUEST_METRICS: Final = "nv_trt_llm_request_metrics"
# Custom-metric names the adapter publishes (per pod) and the HPA targets.
INFLIGHT_METRIC: Final = "tritonforge_inflight_requests"
TRTLLM_ACTIVE_METRIC: Final = "tritonforge_trtllm_active_requests"
# Start-up budgets (engine load, compiled graphs, large weights): startupProbe covers them.
STARTUP_SECONDS: Final[dict[str, int]] = {"cpu": 900, "gpu": 3600}
PROBE_PERIOD_SECONDS: Final = 10


@dataclass(frozen=True)
class K8sOptions:
    """Cluster-side choices that are not properties of the model deployment itself."""

    image: str | None = None  # default: DEFAULT_IMAGES by engine/device
    namespace: str | None = None  # None: the namespace kubectl applies to
    min_replicas: int = 1
    max_replicas: int = 4
    # Scale out when in-flight requests per replica exceed this share of the engine's
    # concurrent sequences (vLLM max_num_seqs, TensorRT-LLM max_batch_size).
    target_utilization: float = 0.8
    prometheus_url: str = DEFAULT_PROMETHEUS_URL  # Grafana's datasource


# Images with tritonforge installed (the generated model.py files import it): the Dockerfile's
# ``cpu`` target, or an NGC tritonserver image with ``pip install tritonforge[...]`` on top
# (docs/scaling.md shows the two-line Dockerfile).
DEFAULT_IMAGES: Final[dict[str, str]] = {
    "cpu": "tritonforge-cpu:latest",
    "vllm": "tritonforge-vllm:latest",
    "tensorrtllm": "tritonforge-trtllm:latest",
}


@dataclass(frozen=True)
class K8sProblem:
    file: str
    obj: str
    message: str

    def __str__(self) -> str:
        return f"{self.file} ({self.obj}): {self.message}"


_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def dns_name(name: str) -> str:
    """A Kubernetes object name (RFC 1123 label) for a served model name."""
    out = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return (out or "model")[:50].rstrip("-")


def _key(path: str) -> str:
    """ConfigMap key for a repository file (keys allow ``[-._a-zA-Z0-9]`` only)."""
    return path.replace("/", "__")


def _on_gpu(spec: Spec) -> bool:
    return spec.device == "gpu" or (spec.device == "auto" and spec.backend == "tensorrtllm")


def _volume_roots(spec: Spec) -> list[str]:
    """Top-level folders of the absolute paths the server reads (weights, engines, adapters)."""
    paths = [spec.model.path, spec.model.tokenizer, spec.speculative.draft_model,
             *spec.lora.adapters.values()]
    if spec.backend == "tensorrtllm":
        paths += [spec.tensorrtllm.engine_dir]
    roots = set()
    for p in paths:
        if p and p.startswith("/"):
            parts = PurePosixPath(p).parts
            if len(parts) > 1:
                roots.add("/" + parts[1])
    return sorted(roots)


def _word(w: Word) -> str:
    return w.text if w.raw else sh_quote(w.text)


def _trtllm_leader_argv(spec: Spec) -> list[str]:
    """The generated launch.sh's mpirun line, as shell words, without its leading
    ``exec mpirun --allow-run-as-root`` (the leader script adds the host list)."""
    (cmd,) = launch_commands(spec)
    words = [_word(w) for line in cmd for w in line]
    head = ["exec", "mpirun", "--allow-run-as-root"]
    assert words[:3] == head, words[:3]
    return words[3:]


def adapter_rules() -> list[dict[str, Any]]:
    """prometheus-adapter discovery rules (its ``MetricsDiscoveryConfig.rules``): one per
    engine, each publishing a per-pod metric from the engine's own gauges."""
    pod_resources = {"overrides": {"namespace": {"resource": "namespace"},
                                   "pod": {"resource": "pod"}}}
    running, waiting = engine_metrics.REQUESTS_RUNNING, engine_metrics.REQUESTS_WAITING
    return [
        {   # tritonforge's vLLM engine model: sequences running + waiting in vLLM's scheduler
            "seriesQuery": f'{running}{{namespace!="",pod!=""}}',
            "resources": pod_resources,
            "name": {"matches": f"^{running}$", "as": INFLIGHT_METRIC},
            "metricsQuery": (f"sum({running}{{<<.LabelMatchers>>}} + "
                             f"{waiting}{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)"),
        },
        {   # TensorRT-LLM's batch manager: active requests
            "seriesQuery": f'{TRTLLM_REQUEST_METRICS}{{namespace!="",pod!="",request_type="active"}}',
            "resources": pod_resources,
            "name": {"matches": f"^{TRTLLM_REQUEST_METRICS}$", "as": TRTLLM_ACTIVE_METRIC},
            "metricsQuery": (f'sum({TRTLLM_REQUEST_METRICS}{{<<.LabelMatchers>>,'
                             f'request_type="active"}}) by (<<.GroupBy>>)'),
        },
    ]


def _probe(path: str, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": timeout}


@dataclass
class _Plan:
    spec: Spec
    opts: K8sOptions
    name: str
    namespace: str | None
    multi: bool
    labels: dict[str, str]
    selector: dict[str, str]
    gpus_per_pod: int
    image: str
    repo_data: dict[str, str]
    volumes: list[dict[str, Any]]
    leader_containers: list[dict[str, Any]]
    worker_containers: list[dict[str, Any]]
    launch_scripts: dict[str, str]
    service_account: str | None
    service_ports: list[dict[str, Any]]
    hpa_metric: str = ""
    hpa_target: int = 1
    annotations: dict[str, str] = field(default_factory=dict)


def _plan(spec: Spec, repository: dict[str, bytes], opts: K8sOptions) -> _Plan:
    name = dns_name(spec.name)
    par = spec.parallelism
    multi = par.nodes > 1
    gpu = _on_gpu(spec)
    world = world_size(spec)
    gpus_per_pod = world // par.nodes if gpu else 0
    engine = "cpu" if not gpu else spec.backend
    image = opts.image or DEFAULT_IMAGES[engine]
    labels = {"app.kubernetes.io/name": "tritonforge", "app.kubernetes.io/instance": name,
              "app.kubernetes.io/component": "server"}
    selector = ({LWS_NAME_LABEL: name, LWS_WORKER_INDEX_LABEL: "0"} if multi
                else {"app.kubernetes.io/instance": name, "app.kubernetes.io/name": "tritonforge",
                      "app.kubernetes.io/component": "server"})

    repo_items: list[dict[str, Any]] = []
    repo_data: dict[str, str] = {}
    for path, data in sorted(repository.items()):
        key = _key(path)
        assert key not in repo_data, f"two repository files map to ConfigMap key {key}"
        repo_data[key] = data.decode("utf-8")
        item: dict[str, Any] = {"key": key, "path": path}
        if path.endswith(".sh"):
            item["mode"] = 0o755
        repo_items.append(item)

    volumes: list[dict[str, Any]] = [
        {"name": "model-repository",
         "configMap": {"name": f"{name}-model-repository", "items": repo_items}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
        {"name": "cache", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "model-repository", "mountPath": REPOSITORY_MOUNT, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "cache", "mountPath": CACHE_MOUNT},
    ]
    for root in _volume_roots(spec):
        vol = f"data-{dns_name(root.strip('/'))}"
        volumes.append({"name": vol, "persistentVolumeClaim": {
            "claimName": f"{name}-{vol}", "readOnly": True}})
        mounts.append({"name": vol, "mountPath": root, "readOnly": True})

    def secret(key: str) -> dict[str, Any]:
        return {"name": SECRET_KEYS[key], "valueFrom": {"secretKeyRef": {
            "name": f"{name}-secrets", "key": key}}}

    env: list[dict[str, Any]] = [{"name": "TRITONFORGE_CACHE", "value": CACHE_MOUNT},
                                 secret("admin-key")]
    if gpu:
        resources: dict[str, Any] = {"limits": {"nvidia.com/gpu": gpus_per_pod}}
    else:
        space = spec.kv_cache.cpu_space_gib if spec.kv_cache.cpu_space_gib is not None else 4
        # KV cache + the engine and the Python stubs (about 3 GiB peak RSS for the default
        # model, RUNTIME notes) with headroom.
        memory = math.ceil(space) + 4
        resources = {"requests": {"cpu": "2", "memory": f"{memory}Gi"},
                     "limits": {"memory": f"{memory + 2}Gi"}}
    ports = [{"name": "http", "containerPort": HTTP_PORT},
             {"name": "grpc", "containerPort": GRPC_PORT},
             {"name": "metrics", "containerPort": METRICS_PORT}]
    startup = STARTUP_SECONDS["gpu" if gpu else "cpu"]
    probes = {
        "startupProbe": _probe("/v2/health/ready", PROBE_PERIOD_SECONDS,
                               startup // PROBE_PERIOD_SECONDS),
        "readinessProbe": _probe("/v2/health/ready", PROBE_PERIOD_SECONDS, 3),
        "livenessProbe": _probe("/v2/health/live", 15, 4),
    }
    serve = ["tritonforge", "serve", "--repo", REPOSITORY_MOUNT, "--host", "0.0.0.0",
             "--http-port", str(HTTP_PORT), "--grpc-port", str(GRPC_PORT),
             "--metrics-port", str(METRICS_PORT)]
    restricted = _restricted_api("$(TRITONFORGE_ADMIN_KEY)")  # kubelet expands $(VAR)
    launch_scripts: dict[str, str] = {}
    service_account = None
    worker_command: list[str] = []
    if spec.backend == "tensorrtllm" and not multi and world > 1:
        # The generated launch.sh: mpirun, one tritonserver per rank; its arguments go to rank 0.
        server_command = [f"{REPOSITORY_MOUNT}/launch.sh", *restricted]
    elif not multi:
        server_command = serve
    else:
        volumes.append({"name": "launch", "configMap": {"name": f"{name}-launch",
                                                         "defaultMode": 0o755}})
        mounts.append({"name": "launch", "mountPath": LAUNCH_MOUNT, "readOnly": True})
        env.append({"name": "TRITONFORGE_REPOSITORY", "value": REPOSITORY_MOUNT})
        if spec.backend == "tensorrtllm":
            service_account = f"{name}-mpi-launcher"
            launch_scripts = {
                "leader.sh": _render_text(
                    "k8s/trtllm-leader.sh.j2", argv=_trtllm_leader_argv(spec),
                    slots=gpus_per_pod, launch=LAUNCH_MOUNT,
                    restricted=[f'"{f}"' for f in _restricted_api("$TRITONFORGE_ADMIN_KEY")]),
                "kubessh": _render_text("k8s/kubessh.j2"),
            }
            worker_command = ["/bin/sh", "-c", "exec sleep infinity"]
        else:
            launch_scripts = {
                "leader.sh": _render_text("k8s/ray-leader.sh.j2", port=RAY_PORT,
                                          serve=" ".join(sh_quote(w) for w in serve)),
                "worker.sh": _render_text("k8s/ray-worker.sh.j2", port=RAY_PORT),
            }
            env.append({"name": "RAY_ADDRESS", "value": f"127.0.0.1:{RAY_PORT}"})
            worker_command = [f"{LAUNCH_MOUNT}/worker.sh"]
        server_command = [f"{LAUNCH_MOUNT}/leader.sh"]

    def server(cname: str, command: list[str], serving: bool) -> dict[str, Any]:
        c: dict[str, Any] = {"name": cname, "image": image, "command": command}
        if serving:
            c["ports"] = ports
        c.update({"env": env, "resources": resources, "volumeMounts": mounts})
        if serving:
            c.update(probes)
        return c

    gateway_port = {"name": "gateway", "containerPort": GATEWAY_PORT}
    gateway: dict[str, Any] = {
        "name": "gateway", "image": image,
        "command": ["tritonforge", "gateway", "--triton-url", f"127.0.0.1:{GRPC_PORT}",
                    "--host", "0.0.0.0", "--port", str(GATEWAY_PORT), "--model", spec.name],
        "ports": [gateway_port],
        "env": [secret("openai-api-key")],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
    }
    leader = [server("leader" if multi else "triton", server_command, True), gateway]
    workers = [server("worker", worker_command, False)] if multi else []

    plan = _Plan(spec=spec, opts=opts, name=name, namespace=opts.namespace, multi=multi,
                 labels=labels, selector=selector, gpus_per_pod=gpus_per_pod, image=image,
                 repo_data=repo_data, volumes=volumes, leader_containers=leader,
                 worker_containers=workers, launch_scripts=launch_scripts,
                 service_account=service_account,
                 service_ports=[*ports, gateway_port])
    plan.annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
                        "prometheus.io/path": "/metrics"}
    if spec.backend == "tensorrtllm":
        plan.hpa_metric = TRTLLM_ACTIVE_METRIC
        concurrency = spec.batching.max_batch_size
    else:
        plan.hpa_metric = INFLIGHT_METRIC
        concurrency = spec.batching.max_num_seqs or spec.batching.max_batch_size
    plan.hpa_target = max(1, math.floor(concurrency * opts.target_utilization))
    return plan


def _grafana_files() -> tuple[str, str]:
    """The project's Grafana dashboard and dashboard provider (``deploy/grafana``; installed
    wheels carry a copy in ``tritonforge/_data/grafana``)."""
    here = Path(__file__).resolve()
    for root in (here.parents[1] / "_data" / "grafana", here.parents[3] / "deploy" / "grafana"):
        if (root / "dashboards" / "tritonforge.json").is_file():
            return ((root / "dashboards" / "tritonforge.json").read_text(),
                    (root / "provisioning" / "dashboards" / "tritonforge.yaml").read_text())
    raise FileNotFoundError("the Grafana dashboard (deploy/grafana/dashboards/tritonforge.json)")


def _grafana(plan: _Plan) -> dict[str, Any]:
    dashboard, provider = _grafana_files()
    datasource = {"apiVersion": 1, "datasources": [{
        "name": "Prometheus", "uid": GRAFANA_DATASOURCE_UID, "type": "prometheus",
        "access": "proxy", "url": plan.opts.prometheus_url, "isDefault": True,
        "editable": False}]}
    env = [{"name": "GF_SECURITY_ADMIN_USER", "value": "admin"},
           {"name": "GF_SECURITY_ADMIN_PASSWORD", "valueFrom": {"secretKeyRef": {
               "name": f"{plan.name}-secrets", "key": "grafana-admin-password"}}},
           {"name": "GF_USERS_ALLOW_SIGN_UP", "value": "false"},
           {"name": "GF_AUTH_ANONYMOUS_ENABLED", "value": "false"},
           {"name": "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH",
            "value": "/var/lib/grafana/dashboards/tritonforge.json"}]
    container = {
        "name": "grafana", "image": GRAFANA_IMAGE, "env": env,
        "ports": [{"name": "http", "containerPort": GRAFANA_PORT}],
        "readinessProbe": {"httpGet": {"path": "/api/health", "port": "http"},
                           "periodSeconds": 10},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "volumeMounts": [
            {"name": "provisioning", "mountPath": "/etc/grafana/provisioning", "readOnly": True},
            {"name": "dashboards", "mountPath": "/var/lib/grafana/dashboards", "readOnly": True}],
    }
    volumes = [
        {"name": "provisioning", "configMap": {"name": f"{plan.name}-grafana-provisioning",
                                               "items": [
            {"key": "datasource.yaml", "path": "datasources/prometheus.yaml"},
            {"key": "dashboards.yaml", "path": "dashboards/tritonforge.yaml"}]}},
        {"name": "dashboards", "configMap": {"name": f"{plan.name}-grafana-dashboards"}}]
    labels = {**plan.labels, "app.kubernetes.io/component": "grafana"}
    return {"labels": labels, "containers": [container], "volumes": volumes,
            "provisioning": {"datasource.yaml": _yaml(datasource) + "\n",
                             "dashboards.yaml": provider},
            "dashboards": {"tritonforge.json": dashboard}, "port": GRAFANA_PORT}


def _restricted_api(key: str) -> list[str]:
    """Rank 0's flags closing Triton's admin APIs unless the admin-key header carries ``key``
    (the same groups and header ``tritonforge serve`` uses; the key comes from the Secret)."""
    from tritonforge.runtime.server import RESTRICTED_GROUPS, RESTRICTED_HEADER

    value = f"{','.join(RESTRICTED_GROUPS)}:{RESTRICTED_HEADER}={key}"
    return [f"--http-restricted-api={value}", f"--grpc-restricted-protocol={value}"]


class _Dumper(yaml.SafeDumper):
    """Safe YAML without anchors/aliases (each value written out where it is used)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data and all(line == line.rstrip() for line in data.split("\n")) \
        else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def _yaml(value: Any) -> str:
    """Block YAML of a value (PyYAML quotes every string that needs it), no trailing newline."""
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     width=4096, allow_unicode=True).rstrip("\n")


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).with_name("templates"))),
        undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
    env.filters["json"] = json_text
    env.filters["sh"] = sh_quote
    env.filters["yaml"] = _yaml
    return env


def _render_text(template: str, **values: Any) -> str:
    return _env().get_template(template).render(**values)


def render_k8s(spec: Spec, repository: dict[str, bytes],
               opts: K8sOptions | None = None) -> dict[str, bytes]:
    """Every file of ``spec``'s Kubernetes output; ``repository`` is what
    ``render_files(spec)`` returns (it goes into the model-repository ConfigMap)."""
    plan = _plan(spec, repository, opts or K8sOptions())
    files: dict[str, str] = {
        "model-repository.yaml": _render_text("k8s/model-repository.yaml.j2", p=plan),
        "server.yaml": _render_text("k8s/server.yaml.j2", p=plan),
        "service.yaml": _render_text("k8s/service.yaml.j2", p=plan),
        "servicemonitor.yaml": _render_text("k8s/servicemonitor.yaml.j2", p=plan),
        "pdb.yaml": _render_text("k8s/pdb.yaml.j2", p=plan),
        "hpa.yaml": _render_text("k8s/hpa.yaml.j2", p=plan),
        ADAPTER_CONFIG: _render_text("k8s/prometheus-adapter-config.yaml.j2",
                                     rules=adapter_rules()),
        "grafana.yaml": _render_text("k8s/grafana.yaml.j2", p=plan, g=_grafana(plan)),
        ".tritonforge": ("Generated by tritonforge (`tritonforge generate --k8s`). tritonforge "
                         "replaces this whole\nfolder on the next generate: keep your own "
                         f"files elsewhere.\nserved model: {spec.name}\n"),
    }
    if plan.launch_scripts:
        files["launch.yaml"] = _render_text("k8s/launch.yaml.j2", p=plan)
    if plan.service_account:
        files["rbac.yaml"] = _render_text("k8s/rbac.yaml.j2", p=plan)
    return {path: _tidy(text).encode("utf-8") for path, text in sorted(files.items())}


def load_objects(files: dict[str, bytes]) -> dict[str, list[dict[str, Any]]]:
    """The Kubernetes objects of each manifest file (YAML documents, empty ones skipped)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path, data in sorted(files.items()):
        if path.endswith(".yaml") and path != ADAPTER_CONFIG:
            out[path] = [d for d in yaml.safe_load_all(data.decode("utf-8")) if d is not None]
    return out


def _strict(schema: Any) -> Any:
    """``schema`` with unknown fields refused wherever it lists an object's properties (what
    ``kubectl apply --validate=strict`` does; CRD schemas leave it open, and the API server
    would silently prune a misspelt field)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@cache
def _schema(file: str) -> Any:
    doc = json.loads((_SCHEMAS / file).read_text())
    return _strict(doc["schema"])


def _metadata_problems(obj: dict[str, Any]) -> list[str]:
    """CRD schemas do not cover metadata; check it against the core ObjectMeta schema by
    validating it inside a ConfigMap (same ObjectMeta) with kubernetes-validate."""
    import kubernetes_validate  # type: ignore[import-untyped]

    probe = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj.get("metadata", {})}
    try:
        kubernetes_validate.validate(probe, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    return []


def _validator(file: str) -> Callable[[Any], list[str]]:
    import jsonschema  # type: ignore[import-untyped]

    v = jsonschema.Draft202012Validator(_schema(file))

    def check(data: Any) -> list[str]:
        return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                for e in sorted(v.iter_errors(data), key=lambda e: list(map(str, e.path)))]
    return check


def validate_k8s(files: dict[str, bytes]) -> list[K8sProblem]:
    """Every object against the pinned Kubernetes schemas (core kinds: kubernetes-validate,
    strict), CRDs against the project's copies of their upstream schemas, and the
    prometheus-adapter config against its config structs."""
    import kubernetes_validate

    problems: list[K8sProblem] = []
    try:
        objects = load_objects(files)
    except yaml.YAMLError as exc:
        return [K8sProblem("?", "?", f"not YAML: {exc}")]
    for path, docs in objects.items():
        for obj in docs:
            kind, api = obj.get("kind", "?"), obj.get("apiVersion", "?")
            label = f"{kind}/{obj.get('metadata', {}).get('name', '?')}"
            # Names are checked by the API server, not by the OpenAPI schemas.
            if not _DNS_LABEL.fullmatch(str(obj.get("metadata", {}).get("name", ""))):
                problems.append(K8sProblem(path, label, "metadata.name: must be a DNS label "
                                           "(lower-case letters, digits, '-', at most 63)"))
            crd = CRD_SCHEMAS.get((api, kind))
            if crd is not None:
                msgs = _validator(crd)(obj) + _metadata_problems(obj)
                problems += [K8sProblem(path, label, m) for m in msgs]
                continue
            try:
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = ".".join(map(str, exc.path)) or "(top)"
                problems.append(K8sProblem(path, label, f"{where}: {exc.message}"))
            except kubernetes_validate.SchemaNotFoundError:
                problems.append(K8sProblem(path, label, f"no schema for {api} {kind} in "
                                           f"Kubernetes {KUBERNETES_VERSION}"))
    if ADAPTER_CONFIG in files:
        cfg = yaml.safe_load(files[ADAPTER_CONFIG].decode("utf-8"))
        problems += [K8sProblem(ADAPTER_CONFIG, "MetricsDiscoveryConfig", m)
                     for m in _validator("prometheus-adapter-config.json")(cfg)]
    return problems
