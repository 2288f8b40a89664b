"""C++-path LoRA through the real ensemble (issue 12): ``deployments/llama3-8b-trtllm-lora.yaml``
rendered, its adapters converted in TensorRT-LLM's layout, served by the real tritonserver
with the ``tensorrt_llm`` step played by a STAND-IN for the C++ backend (a Python model
with the generated config, which answers with one token telling how many ``lora_weights``
rows and which ``lora_task_id`` it received). An adapter's first request carries its
weights and config; later ones only the task id (Triton's ensemble leaves an optional input
out when preprocessing's response omits the tensor).
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonforge import contract as C
from trtllm_support import MODEL_REF, load_example, set_param, start, write_repo

SPEC = "llama3-8b-trtllm-lora"
BASE = 1000  # token id answered: BASE + 10 * task id + rows of lora_weights received

ENGINE_STANDIN = '''"""STAND-IN for TensorRT-LLM's C++ backend (not it): answers each request with one token,
BASE + 10 * lora_task_id + rows of lora_weights received (a check of what the ensemble sent)."""
import numpy as np
import triton_python_backend_utils as pb

BASE = BASE_VALUE


def _get(request, name):
    t = pb.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            weights, config, task = _get(request, "lora_weights"), _get(request, "lora_config"), _get(request, "lora_task_id")
            rows = 0 if weights is None else int(weights.shape[-2])
            assert (config is None) == (weights is None) and (config is None or config.shape[-2] == rows)
            token = BASE + 10 * (0 if task is None else int(task.reshape(-1)[0])) + rows
            out = [pb.Tensor("output_ids", np.array([[[token]]], dtype=np.int32)),
                   pb.Tensor("sequence_length", np.array([[1]], dtype=np.int32)),
                   pb.Tensor("cum_log_probs", np.array([[0.0]], dtype=np.float32)),
                   pb.Tensor("output_log_probs", np.array([[[0.0]]], dtype=np.float32))]
            request.get_response_sender().send(pb.InferenceResponse(output_tensors=out),
                                               flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''.replace("BASE_VALUE", str(BASE))


def _convert(folder: Path, rows: int) -> None:
    """An adapter in the layout TensorRT-LLM's hf_lora_convert.py writes."""
    folder.mkdir(parents=True)
    np.save(folder / C.LORA_WEIGHTS_FILE, np.ones((1, rows, 32), dtype=np.float16))
    np.save(folder / C.LORA_CONFIG_FILE, np.array([[[0, i, 8] for i in range(rows)]], dtype=np.int32))


@pytest.fixture(scope="module")
def lora(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("trtllm-lora")
    data = load_example(SPEC)
    rows = {"sql": 3, "support": 5}
    for name, n in rows.items():
        _convert(tmp / "adapters" / name, n)
    data["lora"] = {**data["lora"], "adapters": {n: str(tmp / "adapters" / n) for n in rows}}
    repo = write_repo(data, tmp / "repo")
    eng = repo / C.MODEL_TENSORRT_LLM
    cfg = eng / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('backend: "tensorrtllm"', 'backend: "python"'))
    (eng / "1" / "model.py").write_text(ENGINE_STANDIN)
    for model in (C.MODEL_PREPROCESSING, C.MODEL_POSTPROCESSING):
        path = repo / model / "config.pbtxt"
        set_param(path, C.Param.MODEL.value, MODEL_REF)
        set_param(path, C.Param.TOKENIZER.value, MODEL_REF)
        path.write_text(re.sub(r"count: \d+", "count: 1", path.read_text()))
    from tritonforge.render.plan import lora_adapters
    from tritonforge.spec.load import parse_spec

    adapters = lora_adapters(parse_spec(data))
    server, handle = start(repo, log_name="trtllm-lora")
    handle.model = data["name"]
    try:
        yield handle, {name: int(a["id"]) for name, a in adapters.items()}, rows
    finally:
        server.stop()


def _generate_stream(url: str, model: str, body: dict[str, Any]) -> str:
    """HTTP generate_stream (Triton's SSE): the concatenated text_output."""
    req = urllib.request.Request(f"http://{url}/v2/models/{model}/generate_stream",
                                 data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    text = ""
    with urllib.request.urlopen(req, timeout=120) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("data:"):
                event = json.loads(line[5:])
                assert "error" not in event, event
                text += event.get("text_output", "")
    return text


def test_weights_with_the_first_request_of_each_adapter_only(lora: Any) -> None:
    from tritonforge.triton_models.detokenize import make_decoder
    from tritonforge.triton_models.preprocess import load_tokenizer

    handle, ids, rows = lora
    decode = make_decoder(load_tokenizer(MODEL_REF))
    seen = []
    for i, name in enumerate(("sql", "sql", "support", "sql", "support", None)):
        body: dict[str, Any] = {"id": f"lora-{i}", "text_input": "Hello", "max_tokens": 1}
        if name:
            body["lora_name"] = name
        seen.append(_generate_stream(handle.http_url, handle.model, body))
    expect = [decode([BASE + 10 * ids["sql"] + rows["sql"]]), decode([BASE + 10 * ids["sql"]]),
              decode([BASE + 10 * ids["support"] + rows["support"]]), decode([BASE + 10 * ids["sql"]]),
              decode([BASE + 10 * ids["support"]]), decode([BASE])]
    assert seen == expect
