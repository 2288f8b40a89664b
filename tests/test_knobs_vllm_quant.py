"""GGUF model path, FP8 KV cache and draft-model speculation on the real CPU server.

One server: ``deployments/default.yaml`` with ``model.path`` set to the packaged ``.gguf``
file (``quantization: gguf``), ``kv_cache.dtype: fp8`` and speculative decoding with a draft
model (SmolLM2 itself, prepared locally from the same GGUF). Oracles:

* vLLM's own KV-cache allocation (its "CPU KV cache size: N tokens" log line) equals what 1 GiB
  holds at one byte per element for the target's and the draft's layers (the model's
  config.json), half of what it would hold in bf16;
* greedy text equals vLLM's offline output (``tests/vllm_oracle.py``) with the same FP8 KV
  cache and draft model: vLLM 0.32 has no GGUF method, and the engine serves the GGUF
  dequantized with ``quantization`` left unset (before, it passed ``quantization="gguf"`` and
  the engine failed to start);
* vLLM's own speculative-decoding counts: drafts proposed, and (the draft being the target
  model) all but a few drafted tokens accepted.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import metric, serve_spec
from tritonforge.clients import Client

ROOT = Path(__file__).resolve().parents[1]
TRITONFORGE = str(Path(sys.executable).parent / "tritonforge")
MODEL = "kv8"
KV_GIB = 1
PROMPTS = ("Once upon a time, there was a little", "List the days of the week: Monday, Tuesday,")

pytestmark = pytest.mark.server


def _metric(metrics_url: str, name: str) -> float:
    return metric(metrics_url, name, required=True, model="vllm_engine")


@pytest.fixture(scope="module")
def fp8_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from tritonforge.runtime.models import _packaged_file, resolve_model

    gguf = _packaged_file("package:smollm2-135m-instruct")
    folder = resolve_model("package:smollm2-135m-instruct")
    spec = yaml.safe_load((ROOT / "deployments" / "default.yaml").read_text())
    spec["name"] = MODEL
    spec["model"] = {**spec["model"], "path": str(gguf)}
    spec["quantization"] = "gguf"
    spec["kv_cache"] = {"cpu_space_gib": KV_GIB, "dtype": "fp8"}
    spec["speculative"] = {"method": "draft_model", "draft_model": str(folder),
                           "num_speculative_tokens": 3}
    with serve_spec(spec, tmp_path_factory.mktemp("vllm-fp8"), "kv8") as addresses:
        yield {**addresses, "folder": folder}


@pytest.fixture(scope="module")
def fp8_oracle() -> Iterator[Any]:
    """Offline vLLM with the server's KV dtype and draft model. (Against offline vLLM without
    speculation, the text parts after ~25 tokens on the first prompt: with an FP8 KV cache,
    vLLM's verification of drafted tokens is not bit-identical to one-token decoding; in bf16
    n-gram speculation matched, see test_knobs_vllm.py.)"""
    from conftest import start_oracle
    from tritonforge.runtime.models import resolve_model

    oracle = start_oracle({"kv_cache_dtype": "fp8", "speculative_config": {
        "model": str(resolve_model("package:smollm2-135m-instruct")), "num_speculative_tokens": 3}})
    try:
        yield oracle
    finally:
        oracle.close()


def test_gguf_is_served_dequantized_without_a_quantization_argument(fp8_server: dict[str, Any]) -> None:
    out = fp8_server["spec"].parent / "repo"
    subprocess.run([TRITONFORGE, "generate", str(fp8_server["spec"]), "--output", str(out)],
                   check=True, capture_output=True, timeout=120)
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = text_format.Parse((out / "vllm_engine" / "config.pbtxt").read_text(), mc.ModelConfig())
    args = json.loads(config.parameters["tritonforge_engine_args"].string_value)
    assert "quantization" not in args and args["kv_cache_dtype"] == "fp8", args


def test_fp8_kv_cache_holds_one_byte_per_element(fp8_server: dict[str, Any]) -> None:
    cfg = json.loads((fp8_server["folder"] / "config.json").read_text())
    heads, layers = cfg["num_key_value_heads"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    found = re.findall(r"CPU KV cache size: ([\d,]+) tokens", fp8_server["server_log"].read_text())
    assert found, "vLLM logged no KV cache size"
    tokens = int(found[-1].replace(",", ""))

    def capacity(element_bytes: int) -> int:  # K and V, target + draft layers, 128-token blocks
        per_token = 2 * (layers + layers) * heads * head_dim * element_bytes
        return (KV_GIB * 2**30 // per_token) // 128 * 128

    print(f"\nfp8 KV cache: vLLM allocated {tokens:,} tokens in {KV_GIB} GiB (1 byte/element: "
          f"{capacity(1):,}; bf16 would be {capacity(2):,})")
    assert tokens == capacity(1)


def test_draft_model_speculation_serves_vllms_output(fp8_server: dict[str, Any], fp8_oracle: Any) -> None:
    m = fp8_server["metrics"]
    names = ("drafts", "draft_tokens", "accepted_tokens")
    before = {n: _metric(m, f"tritonforge_engine_spec_decode_{n}_total") for n in names}
    with Client(fp8_server["grpc"], model=MODEL) as client:
        for prompt in PROMPTS:
            served = client.complete(prompt, max_tokens=32, temperature=0.0)
            offline = fp8_oracle.generate(prompt, max_tokens=32, temperature=0.0)
            assert served.text == offline["text"], (prompt, served.text, offline["text"])
    time.sleep(0.5)
    got = {n: _metric(m, f"tritonforge_engine_spec_decode_{n}_total") - before[n] for n in names}
    print(f"\ndraft-model speculation (3 tokens, GGUF model, fp8 KV): {len(PROMPTS)} prompts = vLLM "
          f"offline with the same config; vLLM's counts: {got['drafts']:.0f} drafts, "
          f"{got['draft_tokens']:.0f} drafted, {got['accepted_tokens']:.0f} accepted")
    assert got["drafts"] > 0 and got["draft_tokens"] == 3 * got["drafts"]
    assert got["accepted_tokens"] >= 0.9 * got["draft_tokens"]
