"""``vllm.engine_args``: nested values, checked at generate time against vLLM's own fields.

Oracles: the installed vLLM's ``dataclasses.fields(AsyncEngineArgs)`` (the facts table the
generator checks against must equal them), and vLLM's own ``create_engine_config`` on what
the generator rendered (nested values reach vLLM's config objects).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonforge.render import vllm_args

ROOT = Path(__file__).resolve().parents[1]
TRITONFORGE = str(Path(sys.executable).parent / "tritonforge")


def _generate(tmp_path: Path, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return subprocess.run([TRITONFORGE, "generate", str(path), "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)


def test_facts_table_is_the_installed_vllms_fields() -> None:
    facts = vllm_args.collect()
    assert facts["version"] == vllm_args.VLLM_VERSION
    assert facts["engine_args"] == vllm_args.ENGINE_ARGS
    assert facts["config_args"] == vllm_args.CONFIG_ARGS
    assert facts["mapping_args"] == vllm_args.MAPPING_ARGS


@pytest.mark.parametrize(("engine_args", "expected"), [
    ({"max_num_seq": 4},
     "vllm.engine_args.max_num_seq: not an AsyncEngineArgs field of vLLM 0.32.0; closest: "
     "'max_num_seqs', which the spec sets with batching.max_num_seqs"),
    ({"cpu_offload_gbs": 4},
     "vllm.engine_args.cpu_offload_gbs: not an AsyncEngineArgs field of vLLM 0.32.0; closest: "
     "'cpu_offload_gb'"),
    ({"rope_scaling": {"type": "linear"}},
     "vllm.engine_args.rope_scaling: not an AsyncEngineArgs field of vLLM 0.32.0 (model-config "
     "overrides such as rope_scaling go under vllm.engine_args.hf_overrides)"),
    ({"compilation_config": {"cudagraph_mod": "NONE"}},
     "vllm.engine_args.compilation_config.cudagraph_mod: not a field of vLLM's CompilationConfig; "
     "closest: 'cudagraph_mode'"),
    ({"block_size": {"a": 1}},
     "vllm.engine_args.block_size: vLLM's block_size takes a single value, not a mapping"),
    ({"speculative_config": {"prompt_lookup_max": 4}},
     "vllm.engine_args.speculative_config: adds options to speculative decoding, which is off"),
    ({"enable_prefix_caching": True},
     "vllm.engine_args.enable_prefix_caching: set by the spec field kv_cache.prefix_caching"),
])
def test_bad_engine_args_are_refused_at_generate(tmp_path: Path, engine_args: dict[str, Any],
                                                 expected: str) -> None:
    r = _generate(tmp_path, {"name": "m", "vllm": {"engine_args": engine_args}})
    assert r.returncode == 2, r.stdout + r.stderr
    assert expected in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "Fix:" in r.stderr
    assert not (tmp_path / "out").exists()


def test_nested_engine_args_reach_vllms_engine_config(tmp_path: Path) -> None:
    spec = {
        "name": "m", "device": "cpu", "model": {"max_model_len": 2048},
        "speculative": {"method": "ngram", "num_speculative_tokens": 3},
        "vllm": {"enforce_eager": True, "engine_args": {
            "compilation_config": {"mode": 0},
            "hf_overrides": {"rope_theta": 12345.0},
            "speculative_config": {"prompt_lookup_max": 4, "prompt_lookup_min": 2},
        }},
    }
    r = _generate(tmp_path, spec)
    assert r.returncode == 0, r.stderr
    config = text_format.Parse((tmp_path / "out" / "vllm_engine" / "config.pbtxt").read_text(),
                               mc.ModelConfig())
    args = json.loads(config.parameters["tritonforge_engine_args"].string_value)
    assert args["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3,
                                          "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    from tritonforge.runtime.models import resolve_model

    probe = (
        "import json, sys\n"
        "from vllm import AsyncEngineArgs\n"
        "c = AsyncEngineArgs(model=sys.argv[1], **json.loads(sys.argv[2])).create_engine_config()\n"
        "print('CONFIG', json.dumps({'spec': [c.speculative_config.method,\n"
        "    c.speculative_config.num_speculative_tokens, c.speculative_config.prompt_lookup_max,\n"
        "    c.speculative_config.prompt_lookup_min], 'mode': int(c.compilation_config.mode),\n"
        "    'rope_theta': getattr(c.model_config.hf_config, 'rope_theta', None)}))\n"
    )
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", probe, str(resolve_model("package:smollm2-135m-instruct")),
                          json.dumps(args)], capture_output=True, text=True, timeout=300, env=env)
    line = [x for x in out.stdout.splitlines() if x.startswith("CONFIG ")]
    assert line, out.stdout[-2000:] + out.stderr[-3000:]
    got = json.loads(line[0][len("CONFIG "):])
    assert got == {"spec": ["ngram", 3, 4, 2], "mode": 0, "rope_theta": 12345.0}, got


def test_gguf_renders_no_quantization_and_stock_refuses_it(tmp_path: Path) -> None:
    from tritonforge.runtime.models import _packaged_file

    gguf = str(_packaged_file("package:smollm2-135m-instruct"))
    r = _generate(tmp_path, {"name": "m", "model": {"path": gguf}, "quantization": "gguf"})
    assert r.returncode == 0, r.stderr
    config = text_format.Parse((tmp_path / "out" / "vllm_engine" / "config.pbtxt").read_text(),
                               mc.ModelConfig())
    assert "quantization" not in json.loads(config.parameters["tritonforge_engine_args"].string_value)
    (tmp_path / "stock").mkdir()
    r = _generate(tmp_path / "stock", {"name": "m", "model": {"path": gguf}, "quantization": "gguf",
                                       "vllm": {"engine_model": "stock"}})
    assert r.returncode == 2
    assert "quantization: vLLM 0.32 has no GGUF loader or quantization method" in r.stderr, r.stderr


def test_fp8_weight_quantization_is_refused_on_cpu(tmp_path: Path) -> None:
    """vllm-cpu 0.32.0 with quantization="fp8" fails at engine start (seen here:
    ``_C::static_scaled_fp8_quant() expected at most 0 argument(s)``): refused at generate."""
    r = _generate(tmp_path, {"name": "m", "device": "cpu", "quantization": "fp8"})
    assert r.returncode == 2
    assert "quantization: vLLM 0.32 on CPU cannot run fp8 weight quantization" in r.stderr
    assert "Fix: use quantization: none" in r.stderr
    (tmp_path / "gpu").mkdir()
    r = _generate(tmp_path / "gpu", {"name": "m", "device": "gpu", "quantization": "fp8"})
    assert r.returncode == 0, r.stderr
