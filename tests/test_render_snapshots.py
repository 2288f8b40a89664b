"""Snapshots of every example spec's repository, determinism, --check, model_repository/.

Regenerate the snapshots after an intended change with
``TRITONFORGE_UPDATE_SNAPSHOTS=1 .venv/bin/pytest tests/test_render_snapshots.py``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import typer
from tritonforge.cli import generate as generate_cli
from tritonforge.render.renderer import render_files
from tritonforge.render.validate import read_tree, validate_files
from tritonforge.spec import load_spec
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
DEPLOYMENTS = sorted((ROOT / "deployments").glob("*.yaml"))
SNAPSHOTS = Path(__file__).with_name("snapshots")
UPDATE = os.environ.get("TRITONFORGE_UPDATE_SNAPSHOTS") == "1"


def _app() -> typer.Typer:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    generate_cli.register(app)
    return app


def test_all_example_specs_present() -> None:
    names = {p.stem for p in DEPLOYMENTS}
    assert {"default", "llama3-8b-trtllm-fp8", "qwen2.5-7b-vllm-awq", "qwen2.5-72b-tp4",
            "llama3-8b-lora", "smollm2-vllm-stock"} <= names


@pytest.mark.parametrize("spec_path", DEPLOYMENTS, ids=[p.stem for p in DEPLOYMENTS])
def test_snapshot(spec_path: Path) -> None:
    files = render_files(load_spec(spec_path))
    snap = SNAPSHOTS / spec_path.stem
    if UPDATE:
        shutil.rmtree(snap, ignore_errors=True)
        for rel, data in files.items():
            (snap / rel).parent.mkdir(parents=True, exist_ok=True)
            (snap / rel).write_bytes(data)
    assert snap.is_dir(), f"no snapshot for {spec_path.name}; run with TRITONFORGE_UPDATE_SNAPSHOTS=1"
    expected = read_tree(snap)
    assert sorted(files) == sorted(expected)
    for rel in files:
        assert files[rel] == expected[rel], f"{spec_path.stem}/{rel} differs from its snapshot"
    assert validate_files(files) == []


@pytest.mark.parametrize("spec_path", DEPLOYMENTS, ids=[p.stem for p in DEPLOYMENTS])
def test_generate_twice_gives_identical_bytes(spec_path: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "repo"
    first = runner.invoke(_app(), ["generate", str(spec_path), "--output", str(out)])
    assert first.exit_code == 0, first.output
    tree1 = read_tree(out)
    modes1 = {p.relative_to(out).as_posix(): p.stat().st_mode for p in out.rglob("*")}
    second = runner.invoke(_app(), ["generate", str(spec_path), "--output", str(out)])
    assert second.exit_code == 0, second.output
    assert read_tree(out) == tree1
    assert {p.relative_to(out).as_posix(): p.stat().st_mode for p in out.rglob("*")} == modes1
    assert tree1 == render_files(load_spec(spec_path))
    for script in ("build_engine.sh", "launch.sh"):
        if script in tree1:
            assert os.access(out / script, os.X_OK)
    assert sorted(os.listdir(tmp_path)) == ["repo"]  # no temporary folders left behind
    check = runner.invoke(_app(), ["generate", str(spec_path), "--output", str(out), "--check"])
    assert check.exit_code == 0, check.output


def test_checked_in_model_repository_matches_default_spec() -> None:
    result = CliRunner().invoke(_app(), ["generate", str(ROOT / "deployments" / "default.yaml"),
                                         "--output", str(ROOT / "model_repository"), "--check"])
    assert result.exit_code == 0, result.output
    assert read_tree(ROOT / "model_repository") == render_files(
        load_spec(ROOT / "deployments" / "default.yaml"))
    validate = CliRunner().invoke(_app(), ["validate", str(ROOT / "model_repository")])
    assert validate.exit_code == 0, validate.output


def test_check_reports_drift_with_a_unified_diff_and_writes_nothing(tmp_path: Path) -> None:
    spec_path = ROOT / "deployments" / "default.yaml"
    out = tmp_path / "repo"
    assert CliRunner().invoke(_app(), ["generate", str(spec_path), "-o", str(out)]).exit_code == 0
    cfg = out / "preprocessing" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("max_batch_size: 64", "max_batch_size: 8"))
    (out / "stray.txt").write_text("x\n")
    before = read_tree(out)
    result = CliRunner().invoke(_app(), ["generate", str(spec_path), "-o", str(out), "--check"])
    assert result.exit_code == 1
    assert "--- a/preprocessing/config.pbtxt" in result.stdout
    assert "+++ b/preprocessing/config.pbtxt" in result.stdout
    assert "-max_batch_size: 8" in result.stdout and "+max_batch_size: 64" in result.stdout
    assert "--- a/stray.txt" in result.stdout and "+++ /dev/null" in result.stdout
    assert read_tree(out) == before
    missing = CliRunner().invoke(_app(), ["generate", str(spec_path), "-o",
                                          str(tmp_path / "absent"), "--check"])
    assert missing.exit_code == 1
    assert not (tmp_path / "absent").exists()


def test_check_ignores_python_bytecode_caches(tmp_path: Path) -> None:
    spec_path = ROOT / "deployments" / "default.yaml"
    out = tmp_path / "repo"
    assert CliRunner().invoke(_app(), ["generate", str(spec_path), "-o", str(out)]).exit_code == 0
    cache = out / "preprocessing" / "1" / "__pycache__"
    cache.mkdir()
    (cache / "model.cpython-311.pyc").write_bytes(b"\0")
    result = CliRunner().invoke(_app(), ["generate", str(spec_path), "-o", str(out), "--check"])
    assert result.exit_code == 0, result.output


def test_minimal_spec_is_one_line(tmp_path: Path) -> None:
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text("name: tiny\n")
    result = CliRunner().invoke(_app(), ["generate", str(spec_path), "-o", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r" / "tiny" / "config.pbtxt").is_file()
