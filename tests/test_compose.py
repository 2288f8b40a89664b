"""compose.yaml, the Dockerfile and the monitoring configuration they mount.

Validated with a real Compose implementation: Debian's ``docker-compose`` (1.29, ``apt-get
install -y docker-compose``) runs ``config`` without a Docker engine; Prometheus' config is
checked by Debian's ``promtool`` (package ``prometheus``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tritonforge.loadtests import prom

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose.yaml"
PROFILES = {"cpu": "triton-cpu", "vllm": "triton-vllm", "trtllm": "triton-trtllm"}
HEALTH = "/v2/health/ready"


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: apt-get install -y {package}")
    return path


def _compose_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COMPOSE_", "DOCKER_", "GRAFANA_", "GF_", "MODEL_REPOSITORY"))}
    env.update(extra)
    return env


def _config(path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_tool("docker-compose", "docker-compose"), "-f", str(path), *args, "config"],
        cwd=path.parent, env=_compose_env(**env), check=False, capture_output=True, text=True, timeout=120,
    )


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def resolved() -> dict[str, dict[str, Any]]:
    out = {}
    for profile in PROFILES:
        proc = _config(COMPOSE, "--profile", profile, GRAFANA_ADMIN_PASSWORD="test-only")
        assert proc.returncode == 0, f"docker-compose config --profile {profile}:\n{proc.stderr}"
        out[profile] = yaml.safe_load(proc.stdout)
    return out


# -- a real Compose implementation accepts it -------------------------------------------------
def test_config_passes_for_every_profile(resolved: dict[str, dict[str, Any]]) -> None:
    for profile, service in PROFILES.items():
        services = resolved[profile]["services"]
        assert service in services
        assert profile in services[service]["profiles"]


def test_validator_rejects_a_broken_file(tmp_path: Path) -> None:
    # Proves the check above can fail: the same file with one unknown key is refused.
    broken = tmp_path / "compose.yaml"
    data = yaml.safe_load(COMPOSE.read_text())
    data["services"]["prometheus"]["not_a_compose_key"] = 1
    broken.write_text(yaml.safe_dump(data))
    proc = _config(broken, GRAFANA_ADMIN_PASSWORD="x")
    assert proc.returncode != 0
    assert "not_a_compose_key" in proc.stderr


def test_no_default_grafana_secret() -> None:
    proc = _config(COMPOSE, "--profile", "cpu")
    assert proc.returncode != 0
    assert "GRAFANA_ADMIN_PASSWORD" in proc.stderr
    ok = _config(COMPOSE, "--profile", "cpu", GRAFANA_ADMIN_PASSWORD="s3cret-from-env")
    assert ok.returncode == 0, ok.stderr
    env = yaml.safe_load(ok.stdout)["services"]["grafana"]["environment"]
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == "s3cret-from-env"


def test_variables_override_defaults() -> None:
    proc = _config(
        COMPOSE, "--profile", "trtllm", GRAFANA_ADMIN_PASSWORD="x", TRITON_VERSION="25.01",
        MODEL_REPOSITORY="/srv/repo", TRTLLM_WORLD_SIZE="4", TRTLLM_ENGINE_DIR="/srv/engine",
    )
    assert proc.returncode == 0, proc.stderr
    svc = yaml.safe_load(proc.stdout)["services"]["triton-trtllm"]
    assert svc["image"] == "nvcr.io/nvidia/tritonserver:25.01-trtllm-python-py3"
    assert svc["environment"]["TRTLLM_WORLD_SIZE"] == "4"
    assert "/srv/repo:/models:ro" in svc["volumes"]
    assert "/srv/engine:/engines:ro" in svc["volumes"]


# -- structure ----------------------------------------------------------------------------------
def test_servers_have_profiles_health_and_the_triton_alias(
    resolved: dict[str, dict[str, Any]],
) -> None:
    for profile, name in PROFILES.items():
        svc = resolved[profile]["services"][name]
        assert svc["profiles"] == [profile]
        test = " ".join(svc["healthcheck"]["test"])
        assert HEALTH in test and "8000" in test
        assert "triton" in svc["networks"]["default"]["aliases"]
        ports = {(p["published"], p["target"]) for p in svc["ports"]}
        assert {(8000, 8000), (8001, 8001), (8002, 8002)} <= ports
        mounts = " ".join(svc["volumes"])
        assert "model_repository" in mounts, mounts


def test_gpu_profiles_reserve_gpus_and_use_ngc_images(resolved: dict[str, dict[str, Any]]) -> None:
    for profile, suffix in (("vllm", "-vllm-python-py3"), ("trtllm", "-trtllm-python-py3")):
        svc = resolved[profile]["services"][PROFILES[profile]]
        assert svc["image"].startswith("nvcr.io/nvidia/tritonserver:")
        assert svc["image"].endswith(suffix)
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
        # the thin Python models import tritonforge: the checkout is on PYTHONPATH
        assert "/opt/tritonforge:ro" in " ".join(svc["volumes"])
        paths = svc["environment"]["PYTHONPATH"].split(":")
        # every source folder of the package, as pyproject's editable install lists them
        import tomllib

        folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["dev-mode-dirs"]
        assert sorted(paths) == sorted(f"/opt/tritonforge/{d}" for d in folders)
        assert all((ROOT / p.removeprefix("/opt/tritonforge/") / "tritonforge").is_dir()
                   for p in paths)


def test_trtllm_launches_one_rank_per_gpu_under_mpirun(
    resolved: dict[str, dict[str, Any]],
) -> None:
    svc = resolved["trtllm"]["services"]["triton-trtllm"]
    script = svc["command"][-1]
    assert svc["command"][:2] == ["/bin/bash", "-c"]
    assert "mpirun --allow-run-as-root" in script
    assert "shm-region-prefix-name=prefix" in script
    assert "TRTLLM_WORLD_SIZE" in script
    assert "/engines:ro" in " ".join(svc["volumes"])
    # the script is valid bash (escaped $$ became $ in the resolved file)
    bash = shutil.which("bash")
    assert bash is not None
    check = subprocess.run([bash, "-n", "-c", script.replace("$$", "$")],
                           check=False, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr


def test_cpu_profile_builds_this_repository(resolved: dict[str, dict[str, Any]]) -> None:
    svc = resolved["cpu"]["services"]["triton-cpu"]
    assert svc["build"]["target"] == "cpu"
    assert Path(svc["build"]["context"]).resolve() == ROOT
    assert "command" not in svc  # the image's CMD: tritonforge serve --host 0.0.0.0


def test_monitoring_and_load_services(resolved: dict[str, dict[str, Any]]) -> None:
    services = resolved["cpu"]["services"]
    for name in ("prometheus", "grafana", "locust-master", "locust-worker"):
        assert name in services and "profiles" not in services[name], name
    master, worker = services["locust-master"], services["locust-worker"]
    locustfile = "loadtests/tritonforge/loadtests/locustfile.py"
    assert master["command"][:3] == ["locust", "-f", locustfile] and "--master" in master["command"]
    assert worker["command"][:3] == ["locust", "-f", locustfile] and "--worker" in worker["command"]
    assert "--master-host=locust-master" in worker["command"]
    assert "container_name" not in worker  # scalable: --scale locust-worker=N
    assert master["environment"]["TRITONFORGE_PROMETHEUS_PORT"] == str(prom.DEFAULT_PORT)
    assert worker["build"]["target"] == "loadtest"
    for svc in ("prometheus", "grafana"):
        for vol in services[svc]["volumes"]:
            src = vol.split(":")[0]
            if src.startswith("/"):
                assert Path(src).exists(), f"{svc} mounts a missing path {src}"


def test_raw_file_uses_no_default_secrets(raw: dict[str, Any]) -> None:
    text = COMPOSE.read_text()
    assert re.search(r"GF_SECURITY_ADMIN_PASSWORD:\s*\$\{GRAFANA_ADMIN_PASSWORD:\?", text)
    assert not re.search(r"PASSWORD[^\n]*:-", text), "a password with a default value"
    assert set(raw["volumes"]) >= {"prometheus-data", "grafana-data"}


# -- Prometheus / Grafana configuration -------------------------------------------------------
def test_prometheus_config_is_valid_and_scrapes_every_source() -> None:
    path = ROOT / "deploy" / "prometheus" / "prometheus.yml"
    proc = subprocess.run([_tool("promtool", "prometheus"), "check", "config", str(path)],
                          check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cfg = yaml.safe_load(path.read_text())
    targets = {job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
               for job in cfg["scrape_configs"]}
    assert targets["triton"] == ["triton:8002"]
    assert targets["loadtest"] == [f"locust-master:{prom.DEFAULT_PORT}"]
    assert "gateway" in targets


def test_grafana_provisioning_matches_the_dashboard() -> None:
    prov = ROOT / "deploy" / "grafana" / "provisioning"
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert ds[0]["type"] == "prometheus" and ds[0]["url"] == "http://prometheus:9090"
    uid = ds[0]["uid"]
    providers = yaml.safe_load((prov / "dashboards" / "tritonforge.yaml").read_text())["providers"]
    compose = yaml.safe_load(COMPOSE.read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./deploy/grafana/dashboards:{providers[0]['options']['path']}:ro" in mounts
    dash = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "tritonforge.json").read_text())
    for panel in dash["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == uid, panel["title"]


def test_dockerfile_targets_and_ignore_file() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", text, flags=re.MULTILINE | re.IGNORECASE)
    assert {"cpu", "loadtest"} <= set(stages)
    cpu = text.split("AS cpu", 1)[1]
    assert "scripts/setup.sh" in cpu
    assert 'CMD ["tritonforge", "serve", "--host", "0.0.0.0"]' in cpu
    assert HEALTH in cpu
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", ".cache"} <= ignored
    assert not ignored & {"model_repository", "deployments", "scripts", "generators"}
