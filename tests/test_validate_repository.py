"""`tritonforge validate` catches broken repositories (built by editing generated ones)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonforge.cli import generate as generate_cli
from tritonforge.render import write as write_mod
from tritonforge.render.renderer import render_files
from tritonforge.render.validate import read_tree, validate_repository
from tritonforge.render.write import ValidationFailed, write_repository
from tritonforge.spec import parse_spec
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "deployments" / "default.yaml"
TRT = ROOT / "deployments" / "llama3-8b-trtllm-fp8.yaml"


def _app() -> typer.Typer:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    generate_cli.register(app)
    return app


def generate(spec: Path | dict[str, Any], out: Path) -> Path:
    if isinstance(spec, dict):
        write_repository(out, render_files(parse_spec(spec)))
        return out
    result = CliRunner().invoke(_app(), ["generate", str(spec), "--output", str(out)])
    assert result.exit_code == 0, result.output
    return out


def edit(repo: Path, model: str, change: Callable[[Any], None]) -> None:
    path = repo / model / "config.pbtxt"
    cfg = mc.ModelConfig()
    text_format.Parse(path.read_text(), cfg)
    change(cfg)
    path.write_text(text_format.MessageToString(cfg))


def problems(repo: Path) -> str:
    result = CliRunner().invoke(_app(), ["validate", str(repo)])
    assert result.exit_code == 1, result.output
    return result.stderr


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return generate(DEFAULT, tmp_path / "repo")


def step(cfg: Any, model: str) -> Any:
    return next(s for s in cfg.ensemble_scheduling.step if s.model_name == model)


def test_generated_repositories_validate(repo: Path) -> None:
    result = CliRunner().invoke(_app(), ["validate", str(repo)])
    assert result.exit_code == 0, result.output
    assert validate_repository(repo) == []


def test_validate_usage_errors(tmp_path: Path) -> None:
    assert CliRunner().invoke(_app(), ["validate", str(tmp_path / "nope")]).exit_code == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(_app(), ["validate", str(empty)])
    assert result.exit_code == 1 and "contains no model" in result.stderr


def test_renamed_tensor_in_ensemble_map(repo: Path) -> None:
    def rename(cfg: Any) -> None:
        m = step(cfg, "vllm_engine").input_map
        m["input_idz"] = m.pop("input_ids")
    edit(repo, "smollm2", rename)
    out = problems(repo)
    assert "input_map key 'input_idz' is not an input of vllm_engine" in out
    assert "required input 'input_ids' is not mapped" in out
    assert "smollm2/config.pbtxt (model smollm2)" in out


def test_renamed_output_in_ensemble_map(repo: Path) -> None:
    def rename(cfg: Any) -> None:
        m = step(cfg, "postprocessing").output_map
        m["txt_output"] = m.pop("text_output")
    edit(repo, "smollm2", rename)
    out = problems(repo)
    assert "output_map key 'txt_output' is not an output of postprocessing" in out
    assert "ensemble output 'text_output' is produced by no step" in out


def test_dtype_mismatch(repo: Path) -> None:
    def retype(cfg: Any) -> None:
        next(t for t in cfg.input if t.name == "temperature").data_type = mc.TYPE_INT32
    edit(repo, "vllm_engine", retype)
    out = problems(repo)
    assert "input 'temperature' is TYPE_INT32" in out
    assert "is TYPE_FP32" in out and "Fix: make the dtypes equal" in out


def test_dims_mismatch(repo: Path) -> None:
    def reshape(cfg: Any) -> None:
        t = next(t for t in cfg.input if t.name == "stop_words_list")
        del t.dims[:]
        t.dims.extend([3, -1])
    edit(repo, "vllm_engine", reshape)
    assert "input 'stop_words_list' has dims [3, -1]" in problems(repo)


def test_duplicate_ensemble_output_declaration(repo: Path) -> None:
    def dup(cfg: Any) -> None:
        cfg.output.add().CopyFrom(cfg.output[0])
    edit(repo, "smollm2", dup)
    assert "ensemble output 'text_output' is declared 2 times" in problems(repo)


def test_tensor_produced_twice(repo: Path) -> None:
    def twice(cfg: Any) -> None:
        step(cfg, "vllm_engine").output_map["finish_reason"] = "text_output"
        step(cfg, "postprocessing").input_map["engine_finish_reason"] = "text_output"
    edit(repo, "smollm2", twice)
    assert "tensor 'text_output' is produced by 2 steps" in problems(repo)


@pytest.mark.parametrize("marker", ["${engine_dir}", "{{ model }}", "{% if x %}"])
def test_leftover_placeholder(repo: Path, marker: str) -> None:
    path = repo / "preprocessing" / "config.pbtxt"
    path.write_text(path.read_text().replace('"package:smollm2-135m-instruct"', f'"{marker}"', 1))
    out = problems(repo)
    assert "leftover template placeholder" in out and "preprocessing/config.pbtxt" in out


def test_leftover_placeholder_in_python_file(repo: Path) -> None:
    path = repo / "postprocessing" / "1" / "model.py"
    path.write_text(path.read_text() + "# ${TODO}\n")
    assert "postprocessing/1/model.py" in problems(repo)


def test_decoupled_engine_made_non_decoupled_while_streaming_is_wired(repo: Path) -> None:
    edit(repo, "vllm_engine", lambda c: setattr(c.model_transaction_policy, "decoupled", False))
    out = problems(repo)
    assert "'streaming' is mapped but the model is not decoupled" in out


def test_decoupled_engine_without_streaming_wire(tmp_path: Path) -> None:
    repo = generate({"name": "m", "streaming": False}, tmp_path / "r")
    assert validate_repository(repo) == []
    edit(repo, "vllm_engine", lambda c: setattr(c.model_transaction_policy, "decoupled", True))
    assert "the model is decoupled but its 'streaming' input is not mapped" in problems(repo)


def test_sync_model_must_not_be_decoupled(repo: Path) -> None:
    edit(repo, "smollm2_sync", lambda c: setattr(c.model_transaction_policy, "decoupled", True))
    assert "the non-streaming (*_sync) model is decoupled" in problems(repo)


def test_response_cache_on_decoupled_model(repo: Path) -> None:
    edit(repo, "vllm_engine", lambda c: setattr(c.response_cache, "enable", True))
    assert "response_cache is enabled on a decoupled model" in problems(repo)


def test_mixing_decoupled_responses_with_earlier_tensors(repo: Path) -> None:
    def mix(cfg: Any) -> None:
        pre = step(cfg, "preprocessing")
        pre.output_map["out_end_id"] = "preprocessing__out_end_id"
        step(cfg, "postprocessing").input_map["engine_num_input_tokens"] = (
            "preprocessing__out_end_id")
    edit(repo, "smollm2", mix)
    assert "reads responses of a decoupled model together with tensors from before it" in (
        problems(repo))


def test_missing_composing_model(repo: Path) -> None:
    shutil.rmtree(repo / "postprocessing")
    out = problems(repo)
    assert "step 2 uses model 'postprocessing', which is not in the repository" in out


def test_cycle(repo: Path) -> None:
    def cycle(cfg: Any) -> None:
        step(cfg, "preprocessing").input_map["text_input"] = "vllm_engine__output_ids"
    edit(repo, "smollm2", cycle)
    out = problems(repo)
    assert "form a cycle" in out
    assert "ensemble input 'text_input' is consumed by no step" in out


def test_max_batch_size_along_the_chain(repo: Path) -> None:
    edit(repo, "postprocessing", lambda c: setattr(c, "max_batch_size", 8))
    assert "ensemble max_batch_size 64 exceeds postprocessing's 8" in problems(repo)


def test_postprocessing_instances_with_streaming(repo: Path) -> None:
    edit(repo, "postprocessing", lambda c: setattr(c.instance_group[0], "count", 2))
    assert "instance count 2 with a decoupled (streaming) engine" in problems(repo)


def test_unparsable_config_and_name_mismatch(repo: Path) -> None:
    (repo / "preprocessing" / "config.pbtxt").write_text("name: \"preprocessing\"\nmax_batch: 3\n")
    edit(repo, "postprocessing", lambda c: setattr(c, "name", "post"))
    out = problems(repo)
    assert "does not parse as Triton ModelConfig" in out
    assert "name 'post' differs from its folder 'postprocessing'" in out


def test_bad_json_parameter(repo: Path) -> None:
    edit(repo, "vllm_engine",
         lambda c: c.parameters["tritonforge_engine_args"].__setattr__("string_value", "{x"))
    assert "parameter tritonforge_engine_args is not valid JSON" in problems(repo)


def test_missing_target_model(repo: Path) -> None:
    edit(repo, "smollm2_sync",
         lambda c: c.parameters["tritonforge_target_model"].__setattr__("string_value", "gone"))
    assert "names model 'gone', which is not in the repository" in problems(repo)


def test_unknown_trtllm_parameter(tmp_path: Path) -> None:
    repo = generate(TRT, tmp_path / "r")
    assert validate_repository(repo) == []
    edit(repo, "tensorrt_llm",
         lambda c: c.parameters["enable_kv_cache_reus"].__setattr__("string_value", "true"))
    out = problems(repo)
    assert "parameter 'enable_kv_cache_reus' is not a documented TensorRT-LLM backend" in out


def test_trtllm_engine_config_json_is_checked(tmp_path: Path) -> None:
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "config.json").write_text(json.dumps({"build_config": {
        "max_batch_size": 8, "max_seq_len": 1024, "max_input_len": 512, "max_beam_width": 1}}))
    doc = {"name": "m", "backend": "tensorrtllm", "model": {"path": "/m",
           "max_model_len": 2048}, "tensorrtllm": {"engine_dir": str(engine)}}
    out_dir = tmp_path / "r"
    with pytest.raises(ValidationFailed) as info:
        write_repository(out_dir, render_files(parse_spec(doc)))
    text = "\n".join(str(p) for p in info.value.problems)
    assert "max_batch_size 64 exceeds the engine's max_batch_size 8" in text
    assert "model.max_model_len 2048 exceeds the engine's max_seq_len 1024" in text
    assert "max_input_len 512" in text
    assert not out_dir.exists()
    # and through the CLI: exit 1, nothing written
    spec = tmp_path / "s.json.yaml"
    spec.write_text(json.dumps(doc))
    result = CliRunner().invoke(_app(), ["generate", str(spec), "-o", str(out_dir)])
    assert result.exit_code == 1 and "failed validation" in result.stderr
    assert not out_dir.exists()
    doc["batching"] = {"max_batch_size": 8}
    doc["model"]["max_model_len"] = 513
    write_repository(out_dir, render_files(parse_spec(doc)))
    assert validate_repository(out_dir) == []


def test_stock_model_json_is_checked(tmp_path: Path) -> None:
    repo = generate(ROOT / "deployments" / "smollm2-vllm-stock.yaml", tmp_path / "r")
    (repo / "smollm2-stock" / "1" / "model.json").write_text("{not json")
    assert "is not valid JSON" in problems(repo)


# --- atomic write ----------------------------------------------------------------------------
def test_failed_validation_leaves_the_target_byte_identical(repo: Path) -> None:
    before = read_tree(repo)
    files = dict(render_files(parse_spec({"name": "other"})))
    files["other/config.pbtxt"] = files["other/config.pbtxt"].replace(
        b'key: "input_ids"', b'key: "input_idz"')
    with pytest.raises(ValidationFailed):
        write_repository(repo, files)
    assert read_tree(repo) == before
    assert sorted(os.listdir(repo.parent)) == ["repo"]


def test_failed_swap_restores_the_old_repository(repo: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    before = read_tree(repo)
    real_rename = os.rename
    calls = {"n": 0}

    def flaky(src: Any, dst: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # moving the new tree into place
            raise OSError("disk on fire")
        real_rename(src, dst)

    monkeypatch.setattr(write_mod.os, "rename", flaky)
    with pytest.raises(OSError):
        write_repository(repo, render_files(parse_spec({"name": "other"})))
    monkeypatch.undo()
    assert read_tree(repo) == before
    assert sorted(os.listdir(repo.parent)) == ["repo"]


def test_generate_replaces_an_old_repository_completely(repo: Path) -> None:
    (repo / "stale_model").mkdir()
    (repo / "stale_model" / "config.pbtxt").write_text('name: "stale_model"\n')
    generate({"name": "fresh"}, repo)
    assert not (repo / "stale_model").exists()
    assert (repo / "fresh" / "config.pbtxt").is_file()
    assert sorted(os.listdir(repo.parent)) == ["repo"]
