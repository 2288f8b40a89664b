"""What the rendered files say: tensors from the contract, wiring, parameters, commands,
and that hostile strings in allowed free-text fields never change a file's structure."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonforge import contract as C
from tritonforge.render.commands import argv, build_commands, launch_commands
from tritonforge.render.escape import MARKER_RE, json_text, pbtxt_string, sh_quote
from tritonforge.render.renderer import render_files
from tritonforge.render.validate import validate_files
from tritonforge.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = [
    'say "hi"', "it's", "line\nbreak", "tab\there", "}{", "${HOME}", "{{ name }}",
    "{% if x %}", "{#c#}", "back\\slash", "emoji 😀 文字", "$(rm -rf /)", "`id`", "a:b,c",
    'value: { string_value: "x" }', "\r\n", "%s%%",
]


def parse(files: dict[str, bytes], model: str) -> Any:
    cfg = mc.ModelConfig()
    text_format.Parse(files[f"{model}/config.pbtxt"].decode(), cfg)
    return cfg


def params(cfg: Any) -> dict[str, str]:
    return {k: v.string_value for k, v in cfg.parameters.items()}


def render(doc: dict[str, Any]) -> dict[str, bytes]:
    return render_files(parse_spec(doc))


def trt(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": "m", "backend": "tensorrtllm", "model": {"path": "/models/m"},
                           "tensorrtllm": {"engine_dir": "/engines/m"}}
    doc.update(extra)
    return doc


# --- escaping filters ----------------------------------------------------------------------
@pytest.mark.parametrize("value", HOSTILE)
def test_pbtxt_string_round_trips_and_hides_markers(value: str) -> None:
    cfg = mc.ModelConfig()
    text = f"name: {pbtxt_string(value)}"
    assert not MARKER_RE.search(text)
    assert "\n" not in text
    text_format.Parse(text, cfg)
    assert cfg.name == value


@pytest.mark.parametrize("value", HOSTILE)
def test_json_text_round_trips_and_hides_markers(value: str) -> None:
    doc = {"k": [value, {value: value}], "n": 1}
    text = json_text(doc)
    assert not MARKER_RE.search(text)
    assert json.loads(text) == doc


@pytest.mark.parametrize("value", HOSTILE)
def test_sh_quote_is_one_word(value: str) -> None:
    word = sh_quote(value)
    assert not MARKER_RE.search(word)
    out = subprocess.run(["bash", "-c", f"printf '%s' {word}"], capture_output=True,
                         check=True, timeout=10).stdout.decode()
    assert out == value


# --- the tensor contract and wiring ----------------------------------------------------------
def test_models_use_the_contract_tensors() -> None:
    files = render_files(load_spec(ROOT / "deployments" / "default.yaml"))
    def names(ts: Any) -> list[tuple[str, str, list[int], bool]]:
        return [(t.name, mc.DataType.Name(t.data_type), list(t.dims), getattr(t, "optional", False))
                for t in ts]
    def contract(ts: tuple[C.Tensor, ...], optional: bool | None = None
                 ) -> list[tuple[str, str, list[int], bool]]:
        return [(t.name, t.dtype.value, list(t.dims), t.optional) for t in ts]
    ens = parse(files, "smollm2")
    assert ens.platform == "ensemble"
    assert names(ens.input) == contract(C.ENSEMBLE_INPUTS)
    assert names(ens.output) == contract(C.ENSEMBLE_OUTPUTS)
    pre = parse(files, C.MODEL_PREPROCESSING)
    assert names(pre.input) == contract(C.PREPROCESSING_INPUTS)
    assert names(pre.output) == contract(C.PREPROCESSING_OUTPUTS)
    eng = parse(files, C.MODEL_VLLM_ENGINE)
    assert names(eng.input) == contract(C.ENGINE_INPUTS)
    assert names(eng.output) == contract(C.ENGINE_OUTPUTS + C.ENGINE_EXTRA_OUTPUTS)
    post = parse(files, C.MODEL_POSTPROCESSING)
    assert names(post.input) == contract(C.POSTPROCESSING_INPUTS)
    assert names(post.output) == contract(C.POSTPROCESSING_OUTPUTS)
    sync = parse(files, "smollm2_sync")
    assert names(sync.input) == contract(C.ENSEMBLE_INPUTS)
    assert not sync.model_transaction_policy.decoupled
    assert params(sync) == {C.Param.TARGET_MODEL.value: "smollm2",
                            C.Param.ENGINE_MODEL.value: C.MODEL_VLLM_ENGINE}
    # Postprocessing stops the engine for a cancelled stream: it must see cancelled requests,
    # which Triton's dynamic batcher would answer itself.
    assert not post.HasField("dynamic_batching")
    assert params(post)[C.Param.ENGINE_MODEL.value] == C.MODEL_VLLM_ENGINE
    for cfg in (ens, pre, eng, post, sync):
        assert cfg.max_batch_size == 64


def test_default_repository_settings() -> None:
    files = render_files(load_spec(ROOT / "deployments" / "default.yaml"))
    eng = parse(files, C.MODEL_VLLM_ENGINE)
    assert eng.backend == "python"
    assert eng.model_transaction_policy.decoupled
    assert [(g.count, mc.ModelInstanceGroup.Kind.Name(g.kind)) for g in eng.instance_group] == [
        (1, "KIND_MODEL")]
    p = params(eng)
    args = json.loads(p[C.Param.ENGINE_ARGS.value])
    assert args["enforce_eager"] is False and args["max_model_len"] == 2048
    assert args["max_num_seqs"] == 128 and args["max_num_batched_tokens"] == 2048 and "model" not in args
    assert args["enable_chunked_prefill"] is True and args["enable_prefix_caching"] is True
    assert p[C.Param.STREAM_INTERVAL_MS.value] == "250" and p[C.Param.COALESCE_FROM.value] == "4"
    assert json.loads(p[C.Param.ENGINE_ENV.value]) == {
        "VLLM_CPU_KVCACHE_SPACE": "1", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "128",
        "LRU_CACHE_CAPACITY": "128", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert args["distributed_executor_backend"] == "uni"
    assert p[C.Param.MODEL.value] == "package:smollm2-135m-instruct"
    pre = params(parse(files, C.MODEL_PREPROCESSING))
    defaults = json.loads(pre[C.Param.SAMPLING_DEFAULTS.value])
    assert set(defaults) == set(C.SAMPLING_DEFAULTS)
    assert pre[C.Param.ENGINE_KIND.value] == C.EngineKind.VLLM.value
    assert defaults["max_tokens"] == 128 and defaults["temperature"] == 0.0
    assert pre[C.Param.MAX_MODEL_LEN.value] == "2048"
    for rel in ("preprocessing", "postprocessing", "vllm_engine", "smollm2_sync"):
        src = files[f"{rel}/1/model.py"].decode()
        code = [ln for ln in src.splitlines() if ln.startswith(("from ", "import "))]
        assert len(code) == 1 and code[0].endswith("import TritonPythonModel  # noqa: F401")
        assert code[0].startswith("from tritonforge.triton_models.")


def test_cpu_primitive_cache_caps_yield_to_the_spec_env_and_stay_off_gpu() -> None:
    def env(doc: dict[str, Any]) -> dict[str, str]:
        eng = parse(render(doc), C.MODEL_VLLM_ENGINE)
        return json.loads(params(eng)[C.Param.ENGINE_ENV.value])

    base = {"name": "m", "model": {"path": "/models/m"}}
    overridden = env({**base, "vllm": {"env": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"}}})
    assert overridden["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "1024"
    assert overridden["LRU_CACHE_CAPACITY"] == "128"
    gpu = env({**base, "device": "gpu"})
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in gpu and "LRU_CACHE_CAPACITY" not in gpu


def test_one_cpu_rank_runs_in_the_engine_core_unless_the_spec_says_otherwise() -> None:
    def engine(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        p = params(parse(render(doc), C.MODEL_VLLM_ENGINE))
        return json.loads(p[C.Param.ENGINE_ARGS.value]), json.loads(p[C.Param.ENGINE_ENV.value])

    base = {"name": "m", "model": {"path": "/models/m"}}
    args, env = engine(base)
    assert args["distributed_executor_backend"] == "uni" and env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    for doc in ({**base, "vllm": {"engine_args": {"distributed_executor_backend": "mp"}}},
                {**base, "parallelism": {"tensor_parallel_size": 2}},
                {**base, "device": "gpu"}):
        args, env = engine(doc)
        assert args.get("distributed_executor_backend") in (None, "mp"), doc
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env, doc


def test_ensemble_wiring_follows_the_contract() -> None:
    files = render_files(load_spec(ROOT / "deployments" / "default.yaml"))
    steps = {s.model_name: s for s in parse(files, "smollm2").ensemble_scheduling.step}
    assert list(steps) == [C.MODEL_PREPROCESSING, C.MODEL_VLLM_ENGINE, C.MODEL_POSTPROCESSING]
    pre, eng, post = steps.values()
    assert dict(pre.input_map) == {t.name: t.name for t in C.ENSEMBLE_INPUTS}
    produced = {v: k for k, v in pre.output_map.items()}
    for n, tensor in eng.input_map.items():
        assert produced[tensor] == C.pre_output(n)
    assert "lora_task_id" not in eng.input_map  # lora is off
    # what vLLM does not honour (beam search) is not sent to it; preprocessing refuses it
    unsupported = {"len_penalty", "beam_width"}
    assert set(eng.input_map) == set(C.PREPROCESSED_ENGINE_INPUTS) - {"lora_task_id"} - unsupported
    assert "engine_finish_reason" in post.input_map
    assert dict(post.output_map) == {t.name: t.name for t in C.ENSEMBLE_OUTPUTS}


def test_lora_maps_task_id_and_lists_adapters_in_name_order() -> None:
    files = render_files(load_spec(ROOT / "deployments" / "llama3-8b-lora.yaml"))
    step = parse(files, "llama3-8b-lora").ensemble_scheduling.step[1]
    assert "lora_task_id" in step.input_map
    adapters = json.loads(params(parse(files, "preprocessing"))[C.Param.LORA_ADAPTERS.value])
    assert adapters == {"sql": {"id": 1, "path": "/adapters/llama3-8b-text-to-sql"},
                        "support-de": {"id": 2, "path": "/adapters/llama3-8b-support-de"}}
    args = json.loads(params(parse(files, "vllm_engine"))[C.Param.ENGINE_ARGS.value])
    assert args["enable_lora"] is True and args["max_loras"] == 4 and args["max_lora_rank"] == 16


def test_non_streaming_spec_has_no_decoupled_model_and_no_streaming_wire() -> None:
    files = render({"name": "m", "streaming": False, "response_cache": True})
    assert "m_sync/config.pbtxt" not in files
    ens = parse(files, "m")
    assert ens.response_cache.enable
    assert "streaming" not in ens.ensemble_scheduling.step[1].input_map
    assert not parse(files, "vllm_engine").model_transaction_policy.decoupled
    assert json.loads(params(parse(files, "preprocessing"))[
        C.Param.SAMPLING_DEFAULTS.value])["stream"] is False


def test_response_cache_goes_on_the_sync_model_when_streaming() -> None:
    files = render({"name": "m", "response_cache": True})
    assert parse(files, "m_sync").response_cache.enable
    assert not parse(files, "m").response_cache.enable


def test_bls_model_is_optional_and_decoupled_when_streaming() -> None:
    assert "tensorrt_llm_bls/config.pbtxt" not in render({"name": "m"})
    files = render({"name": "m", "instances": {"bls": 3}})
    bls = parse(files, C.MODEL_BLS)
    assert bls.model_transaction_policy.decoupled and bls.instance_group[0].count == 3
    assert params(bls) == {
        C.Param.TARGET_MODEL.value: C.MODEL_VLLM_ENGINE,
        C.Param.ENGINE_KIND.value: C.EngineKind.VLLM.value,
        C.Param.MODEL.value: "package:smollm2-135m-instruct",
        C.Param.TOKENIZER.value: "package:smollm2-135m-instruct",
        C.Param.SKIP_SPECIAL_TOKENS.value: "true",
    }


def test_trtllm_engine_parameters_come_from_the_spec() -> None:
    files = render_files(load_spec(ROOT / "deployments" / "llama3-8b-trtllm-fp8.yaml"))
    eng = parse(files, C.MODEL_TENSORRT_LLM)
    assert eng.backend == "tensorrtllm" and eng.model_transaction_policy.decoupled
    p = params(eng)
    assert p["gpt_model_type"] == "inflight_fused_batching"
    assert p["batch_scheduler_policy"] == "max_utilization"
    assert p["enable_chunked_context"] == "true" and p["enable_kv_cache_reuse"] == "true"
    assert p["gpt_model_path"] == "/engines/llama3-8b-fp8"
    assert p["kv_cache_free_gpu_mem_fraction"] == "0.9"
    assert p["FORCE_CPU_ONLY_INPUT_TENSORS"] == "no"
    assert "max_attention_window_size" not in p  # unset knobs are simply absent
    assert not any(v.startswith("${") for v in p.values())
    assert eng.dynamic_batching.default_queue_policy.max_queue_size == 1024
    ens_steps = parse(files, "llama3-8b").ensemble_scheduling.step
    assert "engine_finish_reason" not in ens_steps[2].input_map  # the C++ engine lacks it
    assert [t.name for t in eng.output] == [t.name for t in C.ENGINE_OUTPUTS]


def test_trtllm_extra_parameters_pass_through() -> None:
    files = render(trt(tensorrtllm={"engine_dir": "/e",
                                    "parameters": {"gpu_weights_percent": "0.5"}}))
    assert params(parse(files, C.MODEL_TENSORRT_LLM))["gpu_weights_percent"] == "0.5"


def test_stock_vllm_layout() -> None:
    files = render_files(load_spec(ROOT / "deployments" / "smollm2-vllm-stock.yaml"))
    assert sorted(files) == [".tritonforge", "smollm2-stock/1/model.json",
                             "smollm2-stock/config.pbtxt"]
    cfg = parse(files, "smollm2-stock")
    assert cfg.backend == "vllm" and cfg.max_batch_size == 0
    assert cfg.model_transaction_policy.decoupled
    args = json.loads(files["smollm2-stock/1/model.json"])
    assert args["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert args["gpu_memory_utilization"] == 0.3
    lora = render({"name": "s", "model": {"path": "org/m"}, "vllm": {"engine_model": "stock"},
                   "lora": {"enabled": True, "adapters": {"b": "/b", "a": "/a"}}})
    assert json.loads(lora["s/1/multi_lora.json"]) == {"a": "/a", "b": "/b"}


def test_speculative_config_for_vllm() -> None:
    files = render_files(load_spec(ROOT / "deployments" / "qwen2.5-7b-vllm-awq.yaml"))
    args = json.loads(params(parse(files, "vllm_engine"))[C.Param.ENGINE_ARGS.value])
    assert args["speculative_config"] == {"model": "/models/Qwen2.5-0.5B-Instruct",
                                          "num_speculative_tokens": 4}
    assert args["quantization"] == "awq"
    assert args["enable_prefix_caching"] is True and args["enable_chunked_prefill"] is True
    ngram = render({"name": "m", "speculative": {"method": "ngram", "num_speculative_tokens": 3}})
    args = json.loads(params(parse(ngram, "vllm_engine"))[C.Param.ENGINE_ARGS.value])
    assert args["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3}


# --- hostile strings in allowed free-text fields -------------------------------------------
def _structure(files: dict[str, bytes]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for rel, data in files.items():
        if rel.endswith("config.pbtxt"):
            cfg = mc.ModelConfig()
            text_format.Parse(data.decode(), cfg)
            out[rel] = (cfg.name, cfg.backend, cfg.platform, len(cfg.input), len(cfg.output),
                        sorted(cfg.parameters), len(cfg.ensemble_scheduling.step),
                        cfg.max_batch_size, cfg.model_transaction_policy.decoupled)
    return out


@pytest.mark.parametrize("backend", ["vllm", "tensorrtllm"])
def test_hostile_free_text_never_changes_structure(backend: str, tmp_path: Path) -> None:
    bad = "".join(HOSTILE)
    def doc(text: str, words: list[str]) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": "m", "backend": backend,
            "model": {"path": "/models/" + text, "tokenizer": "/tok/" + text},
            "defaults": {"stop_words": words},
            "lora": {"enabled": True, "adapters": {"a": "/adapters/" + text}},
        }
        if backend == "tensorrtllm":
            d["tensorrtllm"] = {"engine_dir": "/engines/" + text,
                                "parameters": {"gpu_weights_percent": text}}
        else:
            d["vllm"] = {"env": {"MY_VAR": text}, "engine_args": {"served_model_name": text}}
        return d

    plain = render(doc("plain", ["stop"]))
    hostile = render(doc(bad, HOSTILE))
    assert sorted(plain) == sorted(hostile)
    assert _structure(plain) == _structure(hostile)
    assert validate_files(hostile) == []
    for rel, data in hostile.items():
        assert not MARKER_RE.search(data.decode()), rel
    pre = params(parse(hostile, "preprocessing"))
    assert pre[C.Param.MODEL.value] == "/models/" + bad
    assert pre[C.Param.TOKENIZER.value] == "/tok/" + bad
    assert json.loads(pre[C.Param.SAMPLING_DEFAULTS.value])["stop_words"] == HOSTILE
    assert json.loads(pre[C.Param.LORA_ADAPTERS.value])["a"]["path"] == "/adapters/" + bad
    if backend == "tensorrtllm":
        p = params(parse(hostile, C.MODEL_TENSORRT_LLM))
        assert p["gpt_model_path"] == "/engines/" + bad and p["gpu_weights_percent"] == bad
        spec = parse_spec(doc(bad, HOSTILE))
        _assert_script_argv(hostile, "build_engine.sh", build_commands(spec), tmp_path)
        _assert_script_argv(hostile, "launch.sh", launch_commands(spec), tmp_path)
    else:
        p = params(parse(hostile, C.MODEL_VLLM_ENGINE))
        assert json.loads(p[C.Param.ENGINE_ENV.value])["MY_VAR"] == bad
        assert json.loads(p[C.Param.ENGINE_ARGS.value])["served_model_name"] == bad


# --- build / launch commands ---------------------------------------------------------------
_RECORDER = """#!/usr/bin/env bash
{ printf '%s\\0' PROG; for a in "$@"; do printf '%s\\0' "$a"; done; printf '\\n\\0'; } >> "$RECORD_FILE"
"""


def _run_script(files: dict[str, bytes], script: str, tmp_path: Path) -> list[list[str]]:
    """Run a generated script with recording stand-ins for python3/trtllm-build/mpirun/
    tritonserver (they cannot run here); return each invocation's argv."""
    repo = tmp_path / "repo"
    for rel, data in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for prog in ("python3", "trtllm-build", "mpirun", "tritonserver"):
        exe = bindir / prog
        exe.write_text(_RECORDER.replace("PROG", prog))
        exe.chmod(0o755)
    record = tmp_path / f"{script}.record"
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "RECORD_FILE": str(record),
           "TRTLLM_EXAMPLES": "/opt/examples"}
    subprocess.run(["bash", str(repo / script)], env=env, check=True, timeout=30)
    calls = record.read_bytes().split(b"\n\0")[:-1]
    return [[a.decode() for a in call.split(b"\0")[:-1]] for call in calls]


def _assert_script_argv(files: dict[str, bytes], script: str, commands: Any,
                        tmp_path: Path) -> None:
    calls = _run_script(files, script, tmp_path)
    repo = str((tmp_path / "repo").resolve())
    expected = []
    for cmd in commands:
        words = [w for w in argv(cmd) if w != "exec" and w != '"$@"']
        words = [w.replace('"$TRTLLM_EXAMPLES', "/opt/examples").rstrip('"')
                 if "TRTLLM_EXAMPLES" in w else w for w in words]
        words = [w.replace('"$REPO"', repo) for w in words]
        expected.append(words)
    assert calls == expected


def test_build_engine_commands_for_fp8() -> None:
    spec = load_spec(ROOT / "deployments" / "llama3-8b-trtllm-fp8.yaml")
    convert, build, tokenizer_info = (argv(c) for c in build_commands(spec))
    assert convert[:2] == ["python3", '"$TRTLLM_EXAMPLES/quantization/quantize.py"']
    pairs = dict(zip(convert[2::2], convert[3::2]))
    assert pairs["--qformat"] == "fp8" and pairs["--kv_cache_dtype"] == "fp8"
    assert pairs["--tp_size"] == "1" and pairs["--pp_size"] == "1"
    assert pairs["--model_dir"] == "/models/Meta-Llama-3-8B-Instruct"
    assert build[0] == "trtllm-build"
    bpairs = dict(zip(build[1::2], build[2::2]))
    assert bpairs["--checkpoint_dir"] == pairs["--output_dir"]
    assert bpairs["--output_dir"] == "/engines/llama3-8b-fp8"
    assert bpairs["--max_batch_size"] == "128" and bpairs["--max_seq_len"] == "8192"
    assert bpairs["--max_num_tokens"] == "8192"
    assert bpairs["--use_paged_context_fmha"] == "enable"
    # xgrammar's tokenizer info for guided decoding, by TensorRT-LLM's own script, in the
    # engine folder, where the backend's xgrammar_tokenizer_info_path points
    assert tokenizer_info[:2] == ["python3", '"$TRTLLM_EXAMPLES/generate_xgrammar_tokenizer_info.py"']
    tpairs = dict(zip(tokenizer_info[2::2], tokenizer_info[3::2]))
    assert tpairs == {"--model_dir": pairs["--model_dir"], "--output_dir": bpairs["--output_dir"]}
    eng = params(parse(render_files(spec), C.MODEL_TENSORRT_LLM))
    assert eng["xgrammar_tokenizer_info_path"] == "/engines/llama3-8b-fp8/xgrammar_tokenizer_info.json"
    assert eng["guided_decoding_backend"] == "xgrammar" and eng["tokenizer_dir"] == ""


def test_build_engine_commands_for_tp4_int4_awq() -> None:
    spec = load_spec(ROOT / "deployments" / "qwen2.5-72b-tp4.yaml")
    convert = argv(build_commands(spec)[0])
    pairs = dict(zip(convert[2::2], convert[3::2]))
    assert pairs["--qformat"] == "int4_awq" and pairs["--tp_size"] == "4"
    eng = params(parse(render_files(spec), C.MODEL_TENSORRT_LLM))
    assert eng["gpu_device_ids"] == "0,1,2,3"


def test_build_engine_for_speculative_and_lora() -> None:
    spec = parse_spec(trt(speculative={"method": "medusa", "draft_model": "/heads",
                                       "num_speculative_tokens": 3},
                          lora={"enabled": True, "adapters": {"b": "/b", "a": "/a"}}))
    convert, build, _ = (argv(c) for c in build_commands(spec))
    assert convert[1] == '"$TRTLLM_EXAMPLES/medusa/convert_checkpoint.py"'
    assert "--medusa_model_dir" in convert and "/heads" in convert
    i = build.index("--speculative_decoding_mode")
    assert build[i + 1] == "medusa" and build[build.index("--max_draft_len") + 1] == "3"
    j = build.index("--lora_dir")
    assert build[j + 1:j + 3] == ["/a", "/b"]
    assert params(parse(render_files(spec), C.MODEL_TENSORRT_LLM))["decoding_mode"] == "medusa"


def test_launch_single_rank_is_plain_tritonserver(tmp_path: Path) -> None:
    spec = load_spec(ROOT / "deployments" / "llama3-8b-trtllm-fp8.yaml")
    files = render_files(spec)
    calls = _run_script(files, "launch.sh", tmp_path)
    assert len(calls) == 1 and calls[0][0] == "tritonserver"
    assert f"--model-repository={(tmp_path / 'repo').resolve()}" in calls[0]
    assert "--http-port=8000" in calls[0]


def test_launch_tp4_uses_mpirun_with_one_server_per_rank(tmp_path: Path) -> None:
    spec = load_spec(ROOT / "deployments" / "qwen2.5-72b-tp4.yaml")
    calls = _run_script(render_files(spec), "launch.sh", tmp_path)
    assert len(calls) == 1
    call = calls[0]
    assert call[:2] == ["mpirun", "--allow-run-as-root"]
    ranks = " ".join(call).split(" : ")
    assert len(ranks) == 4
    for r, text in enumerate(ranks):
        words = shlex.split(text)
        assert "-n" in words and words[words.index("-n") + 1] == "1"
        assert f"--backend-config=python,shm-region-prefix-name=rank{r}_" in words
        if r == 0:
            assert "--http-port=8000" in words
        else:
            assert "--load-model=tensorrt_llm" in words and "--allow-http=false" in words


@pytest.mark.parametrize("name", ["llama3-8b-trtllm-fp8", "qwen2.5-72b-tp4"])
def test_scripts_are_valid_bash(name: str, tmp_path: Path) -> None:
    files = render_files(load_spec(ROOT / "deployments" / f"{name}.yaml"))
    for script in ("build_engine.sh", "launch.sh"):
        path = tmp_path / script
        path.write_bytes(files[script])
        subprocess.run(["bash", "-n", str(path)], check=True, timeout=10)
