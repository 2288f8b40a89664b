"""The launch commands of the LLM-API path (issue 12), run with recording stand-ins for
``tritonserver``, ``mpirun``, ``srun`` and ``trtllm-llmapi-launch`` (none can run here): the
generated ``launch.sh`` / ``launch_slurm.sh``, and compose's ``trtllm`` profile (LLM API by
default, C++ backend with ``TRTLLM_RUNTIME=cpp``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from tritonforge.render.renderer import render_files
from tritonforge.render.write import write_repository
from tritonforge.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
PROGS = ("tritonserver", "mpirun", "srun", "trtllm-llmapi-launch")
RECORDER = """#!/usr/bin/env bash
{ printf '%s\\0' PROG "$@"; printf '\\n'; } >> "$RECORD_FILE"
"""


def _run(script: str, tmp_path: Path, *, cwd: Path | None = None, env: dict[str, str] | None = None,
         file: Path | None = None) -> list[list[str]]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for prog in PROGS:
        exe = bindir / prog
        exe.write_text(RECORDER.replace("PROG", prog))
        exe.chmod(0o755)
    record = tmp_path / "record"
    record.unlink(missing_ok=True)
    args = ["bash", str(file)] if file is not None else ["bash", "-c", script]
    subprocess.run(args, env={"PATH": f"{bindir}:/usr/bin:/bin", "RECORD_FILE": str(record), **(env or {})},
                   cwd=cwd, check=True, timeout=30)
    return [line.split("\0")[:-1] for line in record.read_text().split("\n") if line]


def _repo(name: str, tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    write_repository(repo, render_files(load_spec(ROOT / "deployments" / f"{name}.yaml")))
    return repo.resolve()


def test_single_gpu_runs_tritonserver(tmp_path: Path) -> None:
    repo = _repo("llama3-8b-llmapi", tmp_path)
    (call,) = _run("", tmp_path, file=repo / "launch.sh")
    assert call[0] == "tritonserver" and f"--model-repository={repo}" in call
    assert "--http-port=8000" in call and not (repo / "launch_slurm.sh").exists()


def test_tp4_on_one_host_is_mpirun_through_trtllm_llmapi_launch(tmp_path: Path) -> None:
    repo = _repo("qwen2.5-72b-llmapi-tp4", tmp_path)
    (call,) = _run("", tmp_path, file=repo / "launch.sh")
    i = call.index("trtllm-llmapi-launch")
    assert call[0] == "mpirun" and call[call.index("-n") + 1] == "4" and "--allow-run-as-root" in call
    assert call[i + 1] == "tritonserver" and f"--model-repository={repo}" in call[i + 1:]


@pytest.mark.parametrize(("gpus", "per_node"), [(None, "8"), ("2", "2")])
def test_multi_node_is_srun_with_pmix(tmp_path: Path, gpus: str | None, per_node: str) -> None:
    repo = _repo("qwen2.5-72b-llmapi-tp4", tmp_path)
    (call,) = _run("", tmp_path, file=repo / "launch_slurm.sh",
                   env={"GPUS_PER_NODE": gpus} if gpus else None)
    assert call[:4] == ["srun", "--mpi=pmix", "--ntasks=4", f"--ntasks-per-node={per_node}"]
    assert call[4:6] == ["trtllm-llmapi-launch", "tritonserver"]
    assert f"--model-repository={repo}" in call


def _compose_script() -> str:
    svc = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["triton-trtllm"]
    assert svc["environment"]["TRTLLM_RUNTIME"] == "${TRTLLM_RUNTIME:-llmapi}"  # the default
    return str(svc["command"][-1]).replace("$$", "$")


@pytest.mark.parametrize(("runtime", "world"), [("llmapi", "1"), ("llmapi", "2"), ("cpp", "2")])
def test_compose_trtllm_profile_launch(tmp_path: Path, runtime: str, world: str) -> None:
    (call,) = _run(_compose_script(), tmp_path, env={"TRTLLM_RUNTIME": runtime, "TRTLLM_WORLD_SIZE": world})
    if runtime == "llmapi" and world == "1":
        assert call[0] == "tritonserver" and "--model-repository=/models" in call
    elif runtime == "llmapi":
        assert call[:6] == ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "2",
                            "trtllm-llmapi-launch"]
        assert call[6] == "tritonserver"
    else:
        assert call[0] == "mpirun" and call.count("tritonserver") == 2 and "trtllm-llmapi-launch" not in call
        assert "--backend-config=python,shm-region-prefix-name=prefix1_" in call
