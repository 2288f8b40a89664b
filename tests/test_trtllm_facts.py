"""Every TensorRT-LLM example spec's ``tensorrt_llm`` model against the backend's facts table
(``tritonforge.render.trtllm_params``, from upstream's template), and ``validate`` refusing
what the backend would not load (issue 12).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from tritonforge import contract as C
from tritonforge.render.plan import LLMAPI_MODEL_YAML
from tritonforge.render.renderer import render_files
from tritonforge.render.trtllm_params import (
    TRTLLM_ALWAYS_READ,
    TRTLLM_INPUTS,
    TRTLLM_OUTPUTS,
    TRTLLM_PARAMETERS,
    TRTLLM_PLACEHOLDERS,
    XGRAMMAR_TOKENIZER_INFO_FILE,
    XGRAMMAR_TOKENIZER_INFO_SCRIPT,
)
from tritonforge.render.validate import validate_files
from tritonforge.spec import load_spec
from tritonforge.spec.load import parse_spec

ROOT = Path(__file__).resolve().parents[1]
TRT_SPECS = sorted(p for p in (ROOT / "deployments").glob("*.yaml")
                   if yaml.safe_load(p.read_text()).get("backend") == "tensorrtllm")
# tritonforge's own engine models add these to the backend's tensors (contract extensions).
OWN_EXTRA_INPUTS = {p.engine_name for p in C.REQUEST_PARAMETERS
                    if C.EngineKind.TRTLLM_CPP not in p.engines}
OWN_EXTRA_OUTPUTS = {t.name for t in C.ENGINE_EXTRA_OUTPUTS} - set(TRTLLM_OUTPUTS)


def _config(files: dict[str, bytes], model: str):  # type: ignore[no-untyped-def]
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    return text_format.Parse(files[f"{model}/config.pbtxt"].decode(), mc.ModelConfig())


def _dtype(value: int) -> str:
    from tritonclient.grpc import model_config_pb2 as mc

    return str(mc.DataType.Name(value))


def test_example_specs_cover_both_runtimes_tp_lora_and_speculative() -> None:
    specs = [load_spec(p) for p in TRT_SPECS]
    for runtime in ("cpp", "llmapi"):
        mine = [s for s in specs if s.tensorrtllm.runtime == runtime]
        assert any(s.parallelism.tensor_parallel_size == 1 for s in mine), runtime
        assert any(s.parallelism.tensor_parallel_size == 4 for s in mine), runtime
        assert any(s.lora.enabled for s in mine), runtime
        assert any(s.speculative.method != "none" for s in mine), runtime


@pytest.mark.parametrize("path", TRT_SPECS, ids=[p.stem for p in TRT_SPECS])
def test_tensorrt_llm_model_agrees_with_the_facts_table(path: Path) -> None:
    spec = load_spec(path)
    files = render_files(spec)
    assert validate_files(files) == []
    cfg = _config(files, C.MODEL_TENSORRT_LLM)
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    cpp = spec.tensorrtllm.runtime == "cpp"
    for section, tensors, facts, extra in (("input", cfg.input, TRTLLM_INPUTS, OWN_EXTRA_INPUTS),
                                           ("output", cfg.output, TRTLLM_OUTPUTS, OWN_EXTRA_OUTPUTS)):
        assert tensors, section
        for t in tensors:
            if t.name not in facts:
                assert not cpp and t.name in extra, f"{section} {t.name} is not the backend's"
                continue
            f = facts[t.name]
            assert f.dtype is None or _dtype(t.data_type) == f.dtype, t.name
            assert tuple(t.dims) == f.dims, t.name
            if cpp and section == "input":  # the C++ backend's own declaration, exactly
                assert bool(t.optional) == f.optional, t.name
                assert (t.HasField("reshape") and not t.reshape.shape) == f.scalar, t.name
                assert bool(t.allow_ragged_batch) == f.ragged, t.name
    if cpp:
        assert cfg.backend == "tensorrtllm"
        assert set(params) <= TRTLLM_PARAMETERS, set(params) - TRTLLM_PARAMETERS
        assert params["gpt_model_path"] == spec.tensorrtllm.engine_dir
        assert not set(params) & set(TRTLLM_PLACEHOLDERS)
        assert "build_engine.sh" in files
        # guided decoding on xgrammar, the tokenizer info build_engine.sh writes (the backend
        # reads these three keys with no default)
        assert set(TRTLLM_ALWAYS_READ) <= set(params)
        assert params["guided_decoding_backend"] == "xgrammar"
        info = params["xgrammar_tokenizer_info_path"]
        assert info == f"{spec.tensorrtllm.engine_dir}/{XGRAMMAR_TOKENIZER_INFO_FILE}"
        assert f"{XGRAMMAR_TOKENIZER_INFO_SCRIPT}\" \\\n    --model_dir" in files["build_engine.sh"].decode()
        lora_in = {"lora_weights", "lora_config"}
        steps = _config(files, spec.name).ensemble_scheduling.step
        engine_step = next(st for st in steps if st.model_name == C.MODEL_TENSORRT_LLM)
        post_step = next(st for st in steps if st.model_name == C.MODEL_POSTPROCESSING)
        # guides, several sequences and log-probabilities reach the backend, and come back
        assert {"guided_decoding_guide_type", "guided_decoding_guide", "num_return_sequences",
                "return_log_probs"} <= set(engine_step.input_map)
        assert "top_logprobs" not in engine_step.input_map  # the backend has no such input
        assert {"engine_sequence_index", "engine_output_log_probs"} <= set(post_step.input_map)
        wired = {k: v for k, v in engine_step.input_map.items() if k in lora_in}
        if spec.lora.enabled:  # an adapter's weights, sent by preprocessing (first request only)
            assert wired == {n: f"{C.MODEL_PREPROCESSING}__{C.pre_output(n)}" for n in lora_in}
            assert lora_in <= {t.name for t in cfg.input}
        else:
            assert not wired and not lora_in & {t.name for t in cfg.input}
    else:
        assert cfg.backend == "python" and not set(params) & TRTLLM_PARAMETERS
        assert params[C.Param.ENGINE_KIND.value] == C.EngineKind.TRTLLM_LLMAPI.value
        args = yaml.safe_load(files[f"{C.MODEL_TENSORRT_LLM}/{LLMAPI_MODEL_YAML}"])
        assert args["model"] == spec.model.path and args["backend"] == "pytorch"
        assert args["guided_decoding_backend"] == "xgrammar"  # structured outputs
        assert args["tensor_parallel_size"] == spec.parallelism.tensor_parallel_size
        assert args["kv_cache_config"]["enable_block_reuse"] == spec.kv_cache.prefix_caching
        assert args["enable_chunked_prefill"] == spec.batching.chunked_prefill
        if spec.speculative.method == "eagle":
            assert args["speculative_config"]["decoding_type"] == "Eagle"
        if spec.lora.enabled:
            assert args["enable_lora"] and args["lora_config"]["lora_dir"] == [
                spec.lora.adapters[n] for n in sorted(spec.lora.adapters)]
        assert "build_engine.sh" not in files
        world = spec.parallelism.tensor_parallel_size * spec.parallelism.pipeline_parallel_size
        launch = files["launch.sh"].decode()
        if world > 1:
            assert re.search(rf"mpirun .*-n {world} trtllm-llmapi-launch tritonserver", launch)
            assert f"srun --mpi=pmix --ntasks={world}" in files["launch_slurm.sh"].decode()
        else:
            assert "exec tritonserver" in launch and "launch_slurm.sh" not in files


def test_the_contract_speaks_the_backends_names_and_types() -> None:
    """Every engine tensor the C++ backend is sent or answers is one upstream declares, with
    upstream's dtype and dims (the contract is written against the same table)."""
    for t in C.ENGINE_INPUTS:
        if t.name in OWN_EXTRA_INPUTS:
            continue
        f = TRTLLM_INPUTS[t.name]
        assert (t.dtype.value, t.dims) == (f.dtype, f.dims), t.name
    for t in C.ENGINE_OUTPUTS + tuple(x for x in C.ENGINE_EXTRA_OUTPUTS if x.name in TRTLLM_OUTPUTS):
        f = TRTLLM_OUTPUTS[t.name]
        assert (t.dtype.value, t.dims) == (f.dtype, f.dims), t.name


def _files() -> dict[str, bytes]:
    return render_files(load_spec(ROOT / "deployments" / "llama3-8b-trtllm-fp8.yaml"))


def _edit(files: dict[str, bytes], old: str, new: str) -> dict[str, bytes]:
    rel = f"{C.MODEL_TENSORRT_LLM}/config.pbtxt"
    text = files[rel].decode()
    assert old in text
    return {**files, rel: text.replace(old, new, 1).encode()}


@pytest.mark.parametrize(("old", "new", "said"), [
    ('key: "gpt_model_path"', 'key: "engine_dir"', "placeholder"),
    ('key: "enable_kv_cache_reuse"', 'key: "enable_kv_cache_reus"', "not a documented"),
    ('name: "seed"\n    data_type: TYPE_UINT64', 'name: "seed"\n    data_type: TYPE_INT64', "TYPE_UINT64"),
    ('name: "stop_words_list"\n    data_type: TYPE_INT32\n    dims: [ 2, -1 ]',
     'name: "stop_words_list"\n    data_type: TYPE_INT32\n    dims: [ -1 ]', "dims"),
    ('name: "temperature"\n    data_type: TYPE_FP32\n    dims: [ 1 ]\n    reshape: { shape: [ ] }',
     'name: "temperature"\n    data_type: TYPE_FP32\n    dims: [ 1 ]', "reshape"),
    ('name: "input_lengths"', 'name: "input_length"', "not a tensor"),
    ('key: "xgrammar_tokenizer_info_path"', 'key: "xgrammar_tokenizer_info_pat"',
     "xgrammar_tokenizer_info_path is missing"),
    ('string_value: "xgrammar"', 'string_value: "outlines"', "guided_decoding_backend must be one of"),
])
def test_validate_refuses_what_the_backend_would_not_load(old: str, new: str, said: str) -> None:
    problems = [str(p) for p in validate_files(_edit(_files(), old, new))]
    assert any(said in p and C.MODEL_TENSORRT_LLM in p for p in problems), problems
    if "engine_dir" in new:
        assert any("gpt_model_path" in p and "missing" in p for p in problems), problems


def test_spec_refuses_placeholder_names_and_llmapi_mixups() -> None:
    from tritonforge.spec.errors import SpecError

    base = yaml.safe_load((ROOT / "deployments" / "llama3-8b-trtllm-fp8.yaml").read_text())
    bad = {**base, "tensorrtllm": {"engine_dir": "/e", "parameters": {"engine_dir": "/x"}}}
    with pytest.raises(SpecError, match=r"tensorrtllm\.parameters\.engine_dir: .*gpt_model_path"):
        parse_spec(bad)
    llm = yaml.safe_load((ROOT / "deployments" / "llama3-8b-llmapi.yaml").read_text())
    for extra, where in (({"engine_dir": "/e"}, r"tensorrtllm\.engine_dir"),
                         ({"llm_args": {"tensor_parallel_size": 2}},
                          (r"tensorrtllm\.llm_args\.tensor_parallel_size: set by the spec field "
                           r"parallelism\.tensor_parallel_size"))):
        with pytest.raises(SpecError, match=where):
            parse_spec({**llm, "tensorrtllm": {"runtime": "llmapi", **extra}})
    with pytest.raises(SpecError, match=r"tensorrtllm\.llm_args: applies to runtime llmapi only"):
        parse_spec({**base, "tensorrtllm": {"engine_dir": "/e", "llm_args": {"x": 1}}})
