"""vLLM's own tensor parallelism on CPU behind the same ensemble: 2 worker processes
(vLLM's multiprocessing executor) give the same greedy text as the single-process engine.

The model is a tiny Llama built here (module fixture) because the packaged SmolLM2-135M
has 9 attention heads, and vLLM refuses a tensor-parallel size that does not divide them
("Total number of attention heads (9) must be divisible by tensor parallel size (2)"):
4 attention heads and 2 KV heads (one per rank), head size 32 (one the CPU attention
backend supports), 2 layers, SmolLM2's tokenizer, vocabulary and chat template, random
weights from a fixed seed saved as bfloat16 safetensors. Its ``lm_head`` rows of the
special tokens (ids 0-16, EOS among them) are zero, so greedy decoding never picks one
(a random row's logit beats 0 in practice) and every text runs its full length. Weights
drawn with std 0.1 (not Llama's 0.02) let attention and MLP outweigh the token embedding,
so the next token depends on the context. Building it takes about a second; serving it
takes a fraction of SmolLM2's time (the test this one replaced served SmolLM2 at TP 3 in
515-556 s here).

Both sides run float32. In bfloat16 (tried first; the checkpoint's dtype) a run here gave
identical texts for the story and code prompts, but the Chinese prompt diverged a few
tokens in (after ``... Gore super``: TP 2 went on ``APPceptor Aub...``, the float32 text, one process
`` Matt ma caf...``): the all-reduce sums the ranks' partial results in another order than one
process does, and a random model's top logits are close enough (bf16 ties seen with
transformers too) that greedy decoding follows the last-bit difference. In float32 all three
texts were identical (test 151 s, load average 8.0 with other work running beside it).

The single-process reference is vLLM's offline ``LLM`` on the same folder and dtype
(``tests/vllm_oracle.py``), independent of tritonforge's engine model. The TP server is
generated from the default spec with only the model path, dtype and parallelism changed.

Pipeline parallelism fails on vLLM 0.32 CPU at the first step (an ``AssertionError`` in
``sync_and_gather_intermediate_tensors`` on the second stage), so ``generate`` refuses
``pipeline_parallel_size > 1`` with ``device: cpu`` (asserted below).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import DEFAULT_SPEC, descendants, start_server
from test_e2e_serving import PROMPTS
from tritonforge.cli import generate as generate_cli
from tritonforge.clients import Client
from typer.testing import CliRunner

TP = 2
DTYPE = "float32"
ROPE_THETA = 100000.0
SPECIAL_IDS = 17  # SmolLM2's added tokens: <|endoftext|>, <|im_start|>, <|im_end|>, ...


def _generate(*args: str) -> Any:
    import typer

    app = typer.Typer()
    generate_cli.register(app)
    return CliRunner().invoke(app, ["generate", *args])


def _spec(tmp: Path, model: Path | None = None, **parallelism: int) -> Path:
    doc = yaml.safe_load(DEFAULT_SPEC.read_text())
    doc["parallelism"] = parallelism
    if model is not None:
        doc["model"]["path"] = str(model)
    doc["model"]["dtype"] = DTYPE
    doc.setdefault("vllm", {})["engine_args"] = {"distributed_executor_backend": "mp"}
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 2-layer Llama with 4 heads / 2 KV heads and SmolLM2's tokenizer, random weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from tritonforge.runtime.models import resolve_model

    smollm2 = resolve_model("package:smollm2-135m-instruct")
    out = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(
        vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        rope_theta=ROPE_THETA, tie_word_embeddings=False, initializer_range=0.1,
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight[:SPECIAL_IDS] = 0
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    # As runtime/models.py does: transformers 5 writes only rope_parameters, and some vLLM
    # builds read a top-level rope_theta (falling back silently to another value).
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "rope_theta": ROPE_THETA}))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(smollm2 / name, out / name)
    yield out


def test_pipeline_parallel_on_cpu_is_refused(tmp_path: Path) -> None:
    result = _generate(str(_spec(tmp_path, pipeline_parallel_size=2)), "--output",
                       str(tmp_path / "repo"))
    assert result.exit_code == 2, result.output
    assert "parallelism.pipeline_parallel_size" in result.output
    assert "sync_and_gather_intermediate_tensors" in result.output
    assert not (tmp_path / "repo").exists()


@pytest.mark.server
@pytest.mark.timeout(600)
def test_tensor_parallel_engine_gives_the_single_process_text(tmp_path: Path,
                                                              tiny_llama: Path) -> None:
    from tritonforge.runtime.server import find_install, server_environment
    from vllm_oracle import VllmOracle

    start = time.monotonic()
    env = server_environment(find_install(), {"VLLM_CPU_KVCACHE_SPACE": "1"})
    oracle = VllmOracle(tiny_llama, {"dtype": DTYPE}, env)
    try:
        single = {key: oracle.generate(prompt, temperature=0, max_tokens=n)
                  for key, (prompt, n) in PROMPTS.items()}
    finally:
        oracle.close()
    oracle_s = time.monotonic() - start
    repo = tmp_path / "repo"
    result = _generate(str(_spec(tmp_path, tiny_llama, tensor_parallel_size=TP)),
                       "--output", str(repo))
    assert result.exit_code == 0, result.output
    server, handle = start_server(repo, log_name="test-tp-cpu")
    try:
        # vLLM's own workers: the engine-core process starts one process per rank.
        names = []
        for pid in descendants(server.process.pid):  # type: ignore[attr-defined]
            try:
                names.append(Path(f"/proc/{pid}/comm").read_text().strip())
            except OSError:
                continue
        workers = [n for n in names if "Worker_TP" in n or n.startswith("VllmWorker")]
        parallel: dict[str, str] = {}
        model = yaml.safe_load(DEFAULT_SPEC.read_text())["name"]
        with Client(handle.grpc_url, model=model) as tp:
            for key, (prompt, n) in PROMPTS.items():
                parallel[key] = tp.complete(prompt, max_tokens=n, temperature=0.0).text
    finally:
        server.stop()  # type: ignore[attr-defined]
    print(f"\n{DTYPE}; process names under the TP server: {sorted(set(names))}; oracle "
          f"{oracle_s:.0f} s, test {time.monotonic() - start:.0f} s; "
          f"load average {os.getloadavg()}")
    for key in PROMPTS:
        print(f"{key}: single {single[key]['text']!r} | tp{TP} {parallel[key]!r}")
    assert len(workers) >= TP, names
    # Full-length, prompt-dependent texts: no special token, no early stop.
    for key, (_prompt, n) in PROMPTS.items():
        assert len(single[key]["token_ids"]) == n, single[key]
        assert min(single[key]["token_ids"]) >= SPECIAL_IDS, single[key]
    assert len({s["text"] for s in single.values()}) == len(PROMPTS)
    assert parallel == {key: s["text"] for key, s in single.items()}
