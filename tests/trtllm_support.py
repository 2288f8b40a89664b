"""Helpers of the TensorRT-LLM serving tests (issue 12): repositories rendered from the
TensorRT-LLM example specs, made to run on this CPU machine, and a real tritonserver for them.

Only what a GPU is needed for is replaced: the LLM-API path runs ``tests/standins/
tensorrt_llm`` (TensorRT-LLM's API over vLLM CPU; put on the server's ``PYTHONPATH``), the
C++ path runs tritonforge's engine model answering as the C++ backend does. The rest of each
repository -- ensemble, pre/postprocessing, their parameters -- is what the spec renders.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import yaml
from conftest import metric

ROOT = Path(__file__).resolve().parents[1]
STANDINS = Path(__file__).with_name("standins")
MODEL_REF = "package:smollm2-135m-instruct"


def smollm2_folder() -> Path:
    from tritonforge.runtime.models import resolve_model

    return resolve_model(MODEL_REF)


def load_example(name: str, **overrides: Any) -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "deployments" / f"{name}.yaml").read_text())
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return dict(data)


def write_repo(spec_data: dict[str, Any], out: Path) -> Path:
    from tritonforge.render.renderer import render_files
    from tritonforge.render.write import write_repository
    from tritonforge.spec.load import parse_spec

    write_repository(out, render_files(parse_spec(spec_data)))
    return out


def set_param(config: Path, key: str, value: str) -> None:
    """Replace one ``parameters`` value of a config.pbtxt (or add it)."""
    text = config.read_text()
    pattern = rf'(key: "{re.escape(key)}"\s*value \{{\s*string_value: )"(?:[^"\\]|\\.)*"'
    if re.search(pattern, text):
        text = re.sub(pattern, lambda m: m.group(1) + '"' + value.replace('"', '\\"') + '"', text)
    else:
        text += f'\nparameters {{\n  key: "{key}"\n  value {{\n    string_value: "{value}"\n  }}\n}}\n'
    config.write_text(text)


# Triton 2.51's Python backend checks a starting stub's heartbeat every second; on this
# 2-core machine under other jobs' load a stub can miss one, and the backend then waits for
# ever for that (healthy) stub to exit: the model never loads (gdb: StubLauncher::Launch ->
# WaitForStubProcess; the backend's ReceiveMessageFromStub "is not healthy" path). A start
# that is not ready in START_SECONDS is retried once with a fresh server, and says so.
START_SECONDS = 420
START_ATTEMPTS = 2


def start(repo: Path, *, log_name: str, env: dict[str, str] | None = None) -> tuple[Any, Any]:
    """A real tritonserver on free loopback ports (conftest's ``start_server``, with an
    environment for the server process)."""
    from conftest import ServerHandle
    from tritonforge.runtime.paths import cache_dir
    from tritonforge.runtime.server import ServerError, ServerOptions, TritonServer, free_port

    smollm2_folder()  # prepared once, cached
    for attempt in range(1, START_ATTEMPTS + 1):
        log = cache_dir() / "logs" / f"{log_name}-{os.getpid()}-{attempt}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.unlink(missing_ok=True)
        opts = ServerOptions(repository=repo, http_port=free_port(), grpc_port=free_port(),
                             metrics_port=free_port(), log_file=log,
                             env={"VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})})
        server = TritonServer(opts)
        server.start()
        try:
            server.wait_ready(timeout=START_SECONDS)
            break
        except ServerError:
            server.stop()
            if attempt == START_ATTEMPTS:
                raise
            print(f"tritonserver not ready in {START_SECONDS} s (log {log}); starting it again")
    return server, ServerHandle(http_url=opts.http_url, grpc_url=opts.grpc_url,
                                metrics_url=opts.metrics_url, model="", repo=repo,
                                admin_key=server.admin_key, log_file=log, server=server)


def wait_metric(metrics_url: str, name: str, predicate: Any, seconds: float = 10.0,
                **labels: str) -> float:
    deadline = time.monotonic() + seconds
    value = metric(metrics_url, name, **labels)
    while not predicate(value) and time.monotonic() < deadline:
        time.sleep(0.2)
        value = metric(metrics_url, name, **labels)
    return value
