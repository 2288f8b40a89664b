"""vLLM's own offline output, the independent oracle the serving tests compare against.

``python tests/vllm_oracle.py MODEL_FOLDER [ENGINE_ARGS_JSON]`` runs vLLM's offline ``LLM``
API (not tritonforge's engine model) in its own process and answers JSON-lines requests on
stdin with JSON lines on stdout: ``{"prompt": "..."} | {"prompt_token_ids": [...]}`` plus
``"sampling": {SamplingParams fields}`` and optionally ``"lora": [name, id, path]``, answered
by ``{"text", "token_ids", "logprobs"}``. :class:`VllmOracle` is the test side: one process
per test session serves every test that needs vLLM's reference output.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

READY = "ORACLE-READY"


class VllmOracle:
    """A running offline-vLLM process; ``generate(...)`` asks it for one output."""

    def __init__(self, folder: Path, engine_args: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(folder), json.dumps(engine_args or {})],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,  # so stopping it also ends vLLM's engine-core child
        )
        self._lock = threading.Lock()
        self._stderr: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith(READY):
                return
        raise RuntimeError("the vLLM oracle did not start:\n" + "".join(self._stderr[-60:]))

    def _drain(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-200]

    def generate(self, prompt: str | list[int], lora: tuple[str, int, str] | None = None,
                 **sampling: Any) -> dict[str, Any]:
        """vLLM's output for ``prompt`` (text, or token ids) with these SamplingParams."""
        key = "prompt" if isinstance(prompt, str) else "prompt_token_ids"
        request = {key: prompt, "sampling": sampling, "lora": list(lora) if lora else None}
        with self._lock:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
            while line and not line.startswith("{"):  # vLLM logs some warnings to stdout
                line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the vLLM oracle died:\n" + "".join(self._stderr[-60:]))
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"the vLLM oracle refused {request}: {reply['error']}")
        return dict(reply)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait(30)


def _serve(folder: str, engine_args: dict[str, Any]) -> None:  # pragma: no cover - subprocess
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    tok = AutoTokenizer.from_pretrained(folder)
    args = {"enforce_eager": True, "max_model_len": 2048, "seed": 0, **engine_args}
    llm = LLM(model=folder, **args)
    print(READY, flush=True)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            ids = req.get("prompt_token_ids") or tok.encode(req["prompt"], add_special_tokens=True)
            lora = LoRARequest(*req["lora"]) if req.get("lora") else None
            out = llm.generate({"prompt_token_ids": ids}, SamplingParams(**req["sampling"]),
                               lora_request=lora, use_tqdm=False)
            reply: dict[str, Any] = {"outputs": []}
            for comp in out[0].outputs:
                lps = None
                if comp.logprobs is not None:
                    lps = [{str(t): lp.logprob for t, lp in entry.items()} for entry in comp.logprobs]
                reply["outputs"].append({"text": comp.text, "token_ids": list(comp.token_ids),
                                         "logprobs": lps, "finish_reason": comp.finish_reason})
            reply.update(reply["outputs"][0])
        except Exception as exc:  # noqa: BLE001 - report it to the test, keep serving
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":  # pragma: no cover - subprocess
    _serve(sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
