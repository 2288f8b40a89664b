"""Malformed specs: every one exits 2 through the real CLI, names the field path, writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from tritonforge.cli import generate as generate_cli
from typer.testing import CliRunner

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPEC = REPO_ROOT / "deployments" / "default.yaml"
TRT = {"backend": "tensorrtllm", "model": {"path": "/models/m"},
       "tensorrtllm": {"engine_dir": "/engines/m"}}


def _app() -> typer.Typer:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    generate_cli.register(app)
    return app


def merge(*parts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        for k, v in part.items():
            if isinstance(v, dict) and isinstance(out.get(k), dict):
                out[k] = merge(out[k], v)
            else:
                out[k] = v
    return out


def spec(**fields: Any) -> dict[str, Any]:
    return merge({"name": "m"}, fields)


# (id, spec document (dict or raw YAML text), field path expected in the message)
CASES: list[tuple[str, Any, str]] = [
    ("wrong-type-int", spec(batching={"max_batch_size": "abc"}), "batching.max_batch_size"),
    ("wrong-type-bool", spec(streaming="yes"), "streaming"),
    ("wrong-type-float-as-str", spec(model={"max_model_len": "2048"}), "model.max_model_len"),
    ("wrong-type-list", spec(defaults={"stop_words": "stop"}), "defaults.stop_words"),
    ("unknown-top-key", spec(foo=1), "foo"),
    ("unknown-nested-key", spec(batching={"max_batchsize": 8}), "batching.max_batchsize"),
    ("memory-fraction-1.5", spec(kv_cache={"gpu_memory_fraction": 1.5}),
     "kv_cache.gpu_memory_fraction"),
    ("memory-fraction-0", spec(kv_cache={"gpu_memory_fraction": 0}),
     "kv_cache.gpu_memory_fraction"),
    ("negative-batch", spec(batching={"max_batch_size": -1}), "batching.max_batch_size"),
    ("negative-delay", spec(batching={"max_queue_delay_microseconds": -5}),
     "batching.max_queue_delay_microseconds"),
    ("negative-offload", merge(spec(), TRT, {"kv_cache": {"host_offload_bytes": -1}}),
     "kv_cache.host_offload_bytes"),
    ("zero-tp", spec(parallelism={"tensor_parallel_size": 0}),
     "parallelism.tensor_parallel_size"),
    ("tiny-context", spec(model={"max_model_len": 10}), "model.max_model_len"),
    ("gguf-on-trtllm", merge(spec(), TRT, {"quantization": "gguf"}), "quantization"),
    ("awq-on-trtllm", merge(spec(), TRT, {"quantization": "awq"}), "quantization"),
    ("int4-awq-on-vllm", spec(quantization="int4_awq"), "quantization"),
    ("int8-kv-on-vllm", spec(kv_cache={"dtype": "int8"}), "kv_cache.dtype"),
    ("gguf-without-file", spec(quantization="gguf"), "model.path"),
    ("name-slash", spec(name="a/b"), "name"),
    ("name-backslash", spec(name="a\\b"), "name"),
    ("name-quote", spec(name='my"model'), "name"),
    ("name-single-quote", spec(name="my'model"), "name"),
    ("name-newline", spec(name="my\nmodel"), "name"),
    ("name-braces", spec(name="my{model}"), "name"),
    ("name-dollar-brace", spec(name="${x}"), "name"),
    ("name-jinja", spec(name="{{x}}"), "name"),
    ("name-dotdot", spec(name="../x"), "name"),
    ("name-leading-dot", spec(name=".hidden"), "name"),
    ("name-empty", spec(name=""), "name"),
    ("name-space", spec(name="my model"), "name"),
    ("name-reserved", spec(name="preprocessing"), "name"),
    ("name-missing", {"backend": "vllm"}, "name"),
    ("name-not-string", spec(name=42), "name"),
    ("backend-unknown", spec(backend="onnx"), "backend"),
    ("trtllm-on-cpu", merge(spec(), TRT, {"device": "cpu"}), "device"),
    ("trtllm-no-engine-dir", spec(backend="tensorrtllm", model={"path": "/m"}),
     "tensorrtllm.engine_dir"),
    ("trtllm-unknown-param", merge(spec(), TRT, {"tensorrtllm": {"parameters": {"engin_dir": "x"}}}),
     "tensorrtllm.parameters.engin_dir"),
    ("trtllm-derived-param", merge(spec(), TRT,
                                   {"tensorrtllm": {"parameters": {"engine_dir": "/x"}}}),
     "tensorrtllm.parameters.engine_dir"),
    ("trtllm-placeholder-param", merge(spec(), TRT,
                                       {"tensorrtllm": {"parameters": {"gpu_weights_percent": "${x}"}}}),
     "tensorrtllm.parameters.gpu_weights_percent"),
    ("trtllm-section-on-vllm", spec(tensorrtllm={"engine_dir": "/e"}), "tensorrtllm"),
    ("vllm-section-on-trtllm", merge(spec(), TRT, {"vllm": {"enforce_eager": True}}), "vllm"),
    ("strategy-on-vllm", spec(batching={"strategy": "V1"}), "batching.strategy"),
    ("max-num-seqs-on-trtllm", merge(spec(), TRT, {"batching": {"max_num_seqs": 8}}),
     "batching.max_num_seqs"),
    ("stream-interval-on-trtllm-cpp", merge(spec(), TRT, {"batching": {"stream_interval_ms": 50}}),
     "batching.stream_interval_ms"),
    ("stream-interval-negative", spec(batching={"stream_interval_ms": -1}), "batching.stream_interval_ms"),
    ("streaming-two-postprocessors", spec(instances={"postprocessing": 2}),
     "instances.postprocessing"),
    ("temperature-too-high", spec(defaults={"temperature": 11.0}), "defaults.temperature"),
    ("top-p-zero", spec(defaults={"top_p": 0.0}), "defaults.top_p"),
    ("max-tokens-over-context", spec(model={"max_model_len": 512}, defaults={"max_tokens": 512}),
     "defaults.max_tokens"),
    ("min-over-max-tokens", spec(defaults={"max_tokens": 8, "min_tokens": 9}),
     "defaults.min_tokens"),
    ("stream-default-without-streaming", spec(streaming=False, defaults={"stream": True}),
     "defaults.stream"),
    ("lora-bad-adapter-name", spec(lora={"enabled": True, "adapters": {"a/b": "/x"}}),
     "lora.adapters"),
    ("lora-adapters-disabled", spec(lora={"adapters": {"a": "/x"}}), "lora.enabled"),
    ("gpu-ids-wrong-count", spec(parallelism={"tensor_parallel_size": 2, "gpu_device_ids": [0]}),
     "parallelism.gpu_device_ids"),
    ("draft-missing", spec(speculative={"method": "draft_model"}), "speculative.draft_model"),
    ("lookahead-on-vllm", spec(speculative={"method": "lookahead"}), "speculative.method"),
    ("stock-not-streaming", spec(vllm={"engine_model": "stock"}, model={"path": "org/m"},
                                 streaming=False), "streaming"),
    ("stock-package-model", spec(vllm={"engine_model": "stock"}), "model.path"),
    ("cache-without-sync", spec(response_cache=True, non_streaming_model=False),
     "response_cache"),
    ("engine-arg-derived", spec(vllm={"engine_args": {"max_model_len": 8}}),
     "vllm.engine_args.max_model_len"),
    ("env-bad-name", spec(vllm={"env": {"lower": "1"}}), "vllm.env"),
    ("batched-tokens-below-context", spec(batching={"max_num_batched_tokens": 100}),
     "batching.max_num_batched_tokens"),
    ("nul-in-path", spec(model={"path": "/models/a\x00b"}), "model.path"),
    ("unknown-packaged-model", spec(model={"path": "package:gpt-17"}), "model.path"),
    ("top-level-list", "- name: m\n", "(spec)"),
    ("not-yaml", "name: [unclosed\n", "(yaml)"),
    ("duplicate-key", "name: a\nname: b\n", "duplicate key"),
    ("empty-file", "", "(spec)"),
]


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    out: dict[str, tuple[bytes, int]] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = (p.read_bytes() if p.is_file() else b"<dir>", p.stat().st_mode)
    return out


@pytest.fixture(scope="module")
def existing_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A previously generated repository, the folder every bad generate targets."""
    base = tmp_path_factory.mktemp("existing")
    result = CliRunner().invoke(_app(), ["generate", str(DEFAULT_SPEC), "--output",
                                         str(base / "repo")])
    assert result.exit_code == 0, result.output
    return base / "repo"


def test_at_least_thirty_cases() -> None:
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("case", "document", "path"), CASES, ids=[c[0] for c in CASES])
def test_malformed_spec_exits_2_and_writes_nothing(
    case: str, document: Any, path: str, existing_repo: Path, tmp_path: Path
) -> None:
    spec_file = tmp_path / "spec.yaml"
    text = document if isinstance(document, str) else yaml.safe_dump(document,
                                                                      allow_unicode=True)
    spec_file.write_text(text, encoding="utf-8")
    before = _snapshot(existing_repo)
    parent_before = sorted(os.listdir(existing_repo.parent))
    fresh = tmp_path / "fresh"

    for target in (existing_repo, fresh):
        for extra in ([], ["--check"]):
            result = CliRunner().invoke(_app(), ["generate", str(spec_file), "--output",
                                                 str(target), *extra])
            assert result.exit_code == 2, (case, result.output)
            assert result.exception is None or isinstance(result.exception, SystemExit)
            message = result.stderr
            assert "invalid spec" in message
            assert path in message, message
            assert "Traceback" not in result.output

    assert _snapshot(existing_repo) == before
    assert sorted(os.listdir(existing_repo.parent)) == parent_before
    assert not fresh.exists()
    assert sorted(os.listdir(tmp_path)) == ["spec.yaml"]


def test_entry_point_exit_2_without_traceback(tmp_path: Path) -> None:
    spec_file = tmp_path / "bad.yaml"
    spec_file.write_text("name: a/b\nkv_cache:\n  gpu_memory_fraction: 1.5\n")
    exe = Path(sys.executable).with_name("tritonforge")
    proc = subprocess.run([str(exe), "generate", str(spec_file), "--output",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "name:" in proc.stderr and "kv_cache.gpu_memory_fraction" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_missing_spec_file_is_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), ["generate", str(tmp_path / "nope.yaml"), "--output",
                                         str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "cannot read the spec" in result.stderr
    assert not (tmp_path / "out").exists()


def test_refuses_to_replace_a_foreign_folder(tmp_path: Path) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("precious")
    result = CliRunner().invoke(_app(), ["generate", str(DEFAULT_SPEC), "--output", str(target)])
    assert result.exit_code == 2
    assert "not generated by tritonforge" in result.stderr
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]
    assert (target / "notes.txt").read_text() == "precious"


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(yaml.safe_dump(merge(spec(), TRT, {
        "quantization": "gguf", "device": "cpu", "instances": {"postprocessing": 3}})))
    result = CliRunner().invoke(_app(), ["generate", str(spec_file), "-o", str(tmp_path / "o")])
    assert result.exit_code == 2
    for path in ("quantization", "device", "instances.postprocessing", "model.path"):
        assert f"- {path}:" in result.stderr
