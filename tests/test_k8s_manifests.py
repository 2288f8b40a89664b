"""`tritonforge generate SPEC --k8s DIR`: every emitted object checked by validators that are
not tritonforge's code, and the autoscaling rules checked against a live server's metrics.

* Core kinds: ``kubernetes_validate.validate`` (the Kubernetes OpenAPI schemas shipped in the
  kubernetes-validate wheel, strict: unknown fields refused) at the pinned Kubernetes version.
* CRDs: LeaderWorkerSet (kubernetes-sigs/lws v0.10.0) and ServiceMonitor
  (prometheus-operator v0.93.0) against the upstream CRD schemas kept in
  ``generators/tritonforge/render/k8s_schemas/``, read here with plain ``jsonschema``.
* The embedded model repository is rebuilt from the ConfigMap's items and handed to
  ``tritonforge validate``; launch scripts go through ``sh -n``.
* The prometheus-adapter rules' PromQL is parsed with promql-parser and every metric it names
  is looked up on a scrape of the session's real tritonserver.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import typer
import yaml
from tritonforge.cli import generate as generate_cli
from tritonforge.render import k8s
from tritonforge.render.renderer import render_files
from tritonforge.spec import load_spec
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "generators" / "tritonforge" / "render" / "k8s_schemas"
SPECS = {
    "default": ROOT / "deployments" / "default.yaml",
    "tp4": ROOT / "deployments" / "qwen2.5-72b-tp4.yaml",
    "two-node": ROOT / "deployments" / "llama3.1-405b-trtllm-2node.yaml",
}


def _app() -> typer.Typer:
    app = typer.Typer()
    generate_cli.register(app)
    return app


def _generate(*args: str) -> Any:
    return CliRunner().invoke(_app(), ["generate", *args])


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _objects(root: Path) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(root.glob("*.yaml")):  # kubectl apply -f DIR reads exactly these
        out += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def _crd_validator(file: str) -> jsonschema.Draft202012Validator:
    doc = json.loads((SCHEMAS / file).read_text())
    return jsonschema.Draft202012Validator(doc["schema"])


def _server(objects: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    (server,) = [o for _, o in objects if o["kind"] in ("Deployment", "LeaderWorkerSet")
                 and o["metadata"]["labels"]["app.kubernetes.io/component"] == "server"]
    return server


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] == "Deployment":
        return [obj["spec"]["template"]["spec"]]
    t = obj["spec"]["leaderWorkerTemplate"]
    return [t["leaderTemplate"]["spec"], t["workerTemplate"]["spec"]]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for key, spec in SPECS.items():
        target = tmp_path_factory.mktemp("k8s") / key
        result = _generate(str(spec), "--k8s", str(target))
        assert result.exit_code == 0, result.output
        out[key] = target
    return out


@pytest.mark.parametrize("key", list(SPECS))
def test_every_object_passes_the_pinned_schemas(key: str, generated: dict[str, Path]) -> None:
    objects = _objects(generated[key])
    crds = {("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset-v1.json",
            ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1.json"}
    kinds = []
    for file, obj in objects:
        kinds.append(obj["kind"])
        crd = crds.get((obj["apiVersion"], obj["kind"]))
        if crd is not None:
            errors = [e.message for e in _crd_validator(crd).iter_errors(obj)]
            assert errors == [], (file, errors)
        else:
            assert kubernetes_validate.validate(obj, k8s.KUBERNETES_VERSION, strict=True)
    expected = {"ConfigMap", "Service", "ServiceMonitor", "PodDisruptionBudget",
                "HorizontalPodAutoscaler"}
    assert expected <= set(kinds)
    server = "LeaderWorkerSet" if key == "two-node" else "Deployment"
    assert _server(objects)["kind"] == server
    assert kinds.count("LeaderWorkerSet") == (key == "two-node")
    if key == "two-node":
        assert {"ServiceAccount", "Role", "RoleBinding"} <= set(kinds)


def test_the_validator_refuses_what_the_api_server_would() -> None:
    """The oracles can fail: a misspelt field, a wrong type, a removed API version."""
    spec = load_spec(SPECS["default"])
    files = k8s.render_k8s(spec, render_files(spec))
    dep = yaml.safe_load(files["server.yaml"])
    dep["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, k8s.KUBERNETES_VERSION, strict=True)
    hpa = yaml.safe_load(files["hpa.yaml"])
    hpa["apiVersion"] = "autoscaling/v2beta2"  # the Triton chart's, removed in Kubernetes 1.26
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(hpa, k8s.KUBERNETES_VERSION, strict=True)
    smon = yaml.safe_load(files["servicemonitor.yaml"])
    smon["spec"]["endpoints"][0]["interval"] = 15
    assert list(_crd_validator("servicemonitor-v1.json").iter_errors(smon))
    # ... and tritonforge's own check (run on every generate) reports the same.
    bad = dict(files, **{"server.yaml": yaml.safe_dump(dep).encode()})
    assert any("readinesProbe" in str(p) for p in k8s.validate_k8s(bad))


@pytest.mark.parametrize("key", list(SPECS))
def test_pods_follow_the_spec(key: str, generated: dict[str, Path]) -> None:
    spec = load_spec(SPECS[key])
    par = spec.parallelism
    objects = {o["kind"]: o for _, o in _objects(generated[key])
               if not o["metadata"]["name"].endswith("-grafana")
               and not o["metadata"]["name"].endswith("-launch")}
    server = _server(_objects(generated[key]))
    pods = _pod_specs(server)
    gpus = par.tensor_parallel_size * par.pipeline_parallel_size // par.nodes
    for pod in pods:
        main = pod["containers"][0]
        limits = main["resources"].get("limits", {})
        if spec.device == "cpu":
            assert "nvidia.com/gpu" not in limits
        else:
            assert limits["nvidia.com/gpu"] == gpus
        assert {m["mountPath"] for m in main["volumeMounts"]} >= {"/dev/shm"}
    if server["kind"] == "LeaderWorkerSet":
        assert server["spec"]["leaderWorkerTemplate"]["size"] == par.nodes == 2
        assert gpus == 8
    leader = pods[0]["containers"][0]
    assert leader["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert leader["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    startup = leader["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # engine load
    # Secrets by reference only: no env entry with a literal value for a secret variable,
    # in any pod (the server's, the gateway sidecar's, Grafana's).
    all_pods = [ps for _, o in _objects(generated[key]) if o["kind"] in
                ("Deployment", "LeaderWorkerSet") for ps in _pod_specs(o)]
    seen = set()
    for pod in all_pods:
        for c in pod["containers"]:
            for e in c.get("env", []):
                if e["name"] in k8s.SECRET_KEYS.values():
                    assert "value" not in e and e["valueFrom"]["secretKeyRef"]["name"]
                    seen.add(e["name"])
    assert seen == set(k8s.SECRET_KEYS.values())
    # Kubernetes expands $(VAR) in a command only for variables of the container's own env.
    for pod in pods:
        for c in pod["containers"]:
            names = {e["name"] for e in c.get("env", [])}
            for word in c["command"]:
                for var in re.findall(r"\$\(([A-Z_][A-Z0-9_]*)\)", word):
                    assert var in names, (c["name"], var)
    if key == "tp4":  # TensorRT-LLM TP 4 in one pod: the repository's mpirun launch.sh
        assert leader["command"][0].endswith("/launch.sh")
        assert any("admin-key=$(TRITONFORGE_ADMIN_KEY)" in w for w in leader["command"])
    svc = objects["Service"]
    assert {p["name"] for p in svc["spec"]["ports"]} == {"http", "grpc", "metrics", "gateway"}
    hpa = objects["HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["kind"] == server["kind"]
    assert objects["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == \
        svc["spec"]["selector"]


@pytest.mark.parametrize("key", list(SPECS))
def test_the_configmap_carries_the_generated_repository(key: str, generated: dict[str, Path],
                                                        tmp_path: Path) -> None:
    """Rebuild the repository from the ConfigMap and the pod's volume items, as the kubelet
    would, and hand it to `tritonforge validate`."""
    objects = _objects(generated[key])
    cm = next(o for _, o in objects if o["kind"] == "ConfigMap"
              and o["metadata"]["name"].endswith("-model-repository"))
    server = _server(objects)
    vol = next(v for v in _pod_specs(server)[0]["volumes"] if v["name"] == "model-repository")
    repo = tmp_path / "repo"
    for item in vol["configMap"]["items"]:
        path = repo / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(cm["data"][item["key"]], encoding="utf-8")
    spec = load_spec(SPECS[key])
    assert _tree(repo) == render_files(spec)
    result = _generate(str(SPECS[key]), "--output", str(tmp_path / "direct"))
    assert result.exit_code == 0, result.output
    assert _tree(repo) == _tree(tmp_path / "direct")
    check = CliRunner().invoke(_app(), ["validate", str(repo)])
    assert check.exit_code == 0, check.output


def test_grafana_reads_the_datasource_its_dashboard_names(generated: dict[str, Path]) -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for _, o in _objects(generated["default"])}
    provisioning = objects["ConfigMap", "smollm2-grafana-provisioning"]["data"]
    uids = {d["uid"] for d in yaml.safe_load(provisioning["datasource.yaml"])["datasources"]}
    dashboard = json.loads(objects["ConfigMap", "smollm2-grafana-dashboards"]["data"]
                           ["tritonforge.json"])
    assert dashboard == json.loads((ROOT / "deploy" / "grafana" / "dashboards" /
                                    "tritonforge.json").read_text())
    used = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ds = node.get("datasource")
            if isinstance(ds, dict) and ds.get("type") == "prometheus":
                used.add(ds["uid"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(dashboard)
    assert used and used <= uids
    # The server's Service and PDB select the server pods, not Grafana's.
    grafana = objects["Deployment", "smollm2-grafana"]["spec"]["template"]["metadata"]["labels"]
    for selector in (objects["Service", "smollm2"]["spec"]["selector"],
                     objects["PodDisruptionBudget", "smollm2"]["spec"]["selector"]["matchLabels"],
                     objects["ServiceMonitor", "smollm2"]["spec"]["selector"]["matchLabels"]):
        assert not all(grafana.get(k) == v for k, v in selector.items()), selector


def test_launch_scripts_are_valid_shell(generated: dict[str, Path], tmp_path: Path) -> None:
    objects = _objects(generated["two-node"])
    launch = next(o for _, o in objects if o["metadata"]["name"].endswith("-launch"))
    assert set(launch["data"]) == {"leader.sh", "kubessh"}
    for name, text in launch["data"].items():
        script = tmp_path / name
        script.write_text(text)
        subprocess.run(["sh", "-n", str(script)], check=True)
    leader = launch["data"]["leader.sh"]
    assert leader.count("tritonserver") == 16  # one per rank (TP 8 x PP 2)
    assert "--host" in leader and "plm_rsh_agent" in leader
    vllm_spec = tmp_path / "vllm2.yaml"
    vllm_spec.write_text(yaml.safe_dump({
        "name": "llama-70b", "model": {"path": "/models/llama-70b"}, "device": "gpu",
        "parallelism": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "nodes": 2},
        "vllm": {"engine_args": {"distributed_executor_backend": "ray"}}}))
    out = tmp_path / "vllm-k8s"
    result = _generate(str(vllm_spec), "--k8s", str(out))
    assert result.exit_code == 0, result.output
    ray = next(o for _, o in _objects(out) if o["metadata"]["name"].endswith("-launch"))
    for name, text in ray["data"].items():
        (tmp_path / name).write_text(text)
        subprocess.run(["sh", "-n", str(tmp_path / name)], check=True)
    assert "ray start --head" in ray["data"]["leader.sh"]


@pytest.mark.parametrize(("spec", "field"), [
    ({"name": "m", "device": "cpu", "parallelism": {"nodes": 2, "tensor_parallel_size": 2}},
     "parallelism.nodes"),
    ({"name": "m", "device": "gpu", "model": {"path": "/models/m"},
      "parallelism": {"nodes": 3, "tensor_parallel_size": 4}}, "parallelism.nodes"),
    ({"name": "m", "device": "gpu", "model": {"path": "/models/m"},
      "parallelism": {"nodes": 2, "tensor_parallel_size": 4}},
     "vllm.engine_args.distributed_executor_backend"),
    ({"name": "m", "parallelism": {"nodes": 0}}, "parallelism.nodes"),
])
def test_bad_spec_exits_2_names_the_field_and_leaves_the_folder(
        spec: dict[str, Any], field: str, generated: dict[str, Path], tmp_path: Path) -> None:
    target = generated["default"]
    before = _tree(target)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = _generate(str(path), "--k8s", str(target))
    assert result.exit_code == 2, result.output
    assert field in result.output
    assert "Fix" in result.output or "Input should be" in result.output
    assert _tree(target) == before
    assert sorted(os.listdir(target.parent)) == [target.name]  # no temporary folders left


def test_bad_options_and_check(generated: dict[str, Path]) -> None:
    target = generated["default"]
    before = _tree(target)
    bad = _generate(str(SPECS["default"]), "--k8s", str(target), "--min-replicas", "3",
                    "--max-replicas", "2")
    assert bad.exit_code == 2 and "--max-replicas" in bad.output
    assert _generate(str(SPECS["default"]), "--k8s", str(target), "--check").exit_code == 0
    (target / "hpa.yaml").write_text((target / "hpa.yaml").read_text().replace(
        "maxReplicas: 4", "maxReplicas: 9"))
    drift = _generate(str(SPECS["default"]), "--k8s", str(target), "--check")
    assert drift.exit_code == 1 and "+  maxReplicas: 4" in drift.output
    assert _generate(str(SPECS["default"]), "--k8s", str(target)).exit_code == 0
    assert _tree(target) == before
    assert _generate(str(SPECS["default"])).exit_code == 2  # neither --output nor --k8s


# -- the autoscaling rules against a live server ------------------------------------------

def _selectors(node: Any) -> list[tuple[str, dict[str, str]]]:
    from test_dashboard import _selectors as walk

    return [(s.name, {k: v for k, (_, v) in s.labels.items()}) for s in walk(node)]


def _scrape(metrics_url: str) -> dict[str, list[dict[str, str]]]:
    """Metric name -> label sets, from Triton's own /metrics text."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, list[dict[str, str]]] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out.setdefault(sample.name, []).append(dict(sample.labels))
    return out


@pytest.mark.server
def test_every_metric_the_autoscaler_uses_exists_on_the_live_server(
        triton_server: Any, generated: dict[str, Path]) -> None:
    from test_dashboard import TRTLLM_METRICS

    live = _scrape(triton_server.metrics_url)
    rules_by_name: dict[str, dict[str, Any]] = {}
    for key, root in generated.items():
        config = yaml.safe_load((root / k8s.ADAPTER_CONFIG).read_text())
        for rule in config["rules"]:
            rules_by_name[rule["name"]["as"]] = rule
        hpa = next(o for _, o in _objects(root) if o["kind"] == "HorizontalPodAutoscaler")
        for metric in hpa["spec"]["metrics"]:
            assert metric["type"] == "Pods"
            assert metric["pods"]["metric"]["name"] in rules_by_name, key  # the adapter serves it
    checked_live = 0
    for rule in rules_by_name.values():
        # What the adapter sends for one pod (its <<.LabelMatchers>> / <<.GroupBy>> expanded).
        query = (rule["metricsQuery"].replace("<<.LabelMatchers>>", 'namespace="ns",pod="p"')
                 .replace("<<.GroupBy>>", "pod"))
        used = _selectors(promql_parser.parse(rule["seriesQuery"]))
        used += _selectors(promql_parser.parse(query))
        assert used
        for name, labels in used:
            if name.startswith("nv_trt_llm_"):  # GPU only: the backend's documented names
                label, values = TRTLLM_METRICS[name]
                assert labels.get(label) in values, (name, labels)
                continue
            assert name in live, f"{name} is not exported by the live server"
            label_sets = live[name]
            assert all({"model", "version"} <= set(ls) for ls in label_sets)
            checked_live += 1
    assert checked_live >= 3  # the vLLM rule's series, running and waiting
    # `running + waiting` matches series one to one: both carry the same label names.
    from tritonforge.triton_models.metrics import REQUESTS_RUNNING, REQUESTS_WAITING

    assert {frozenset(s) for s in live[REQUESTS_RUNNING]} == \
        {frozenset(s) for s in live[REQUESTS_WAITING]}
