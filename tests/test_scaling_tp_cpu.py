"""vLLM's own tensor parallelism on CPU behind the same ensemble: 3 worker processes
(vLLM's multiprocessing executor) give the same greedy text as the single-process engine.

Both sides run float32: in bfloat16 (the default spec's dtype) a run here matched on the
story prompt but diverged after about ten tokens on the other two, because a
tensor-parallel all-reduce sums the partial results in another order than one process does
and greedy decoding amplifies the last-bit difference. The single-process reference is
vLLM's offline ``LLM`` on the same model folder (``tests/vllm_oracle.py``), the oracle the
default server's own tests compare with.

Why 3 and not 2: SmolLM2-135M has 9 attention heads (3 KV heads); vLLM refuses a
tensor-parallel size that does not divide them ("Total number of attention heads (9) must be
divisible by tensor parallel size (2)"). Pipeline parallelism, which would split its 30
layers in 2, fails on vLLM 0.32 CPU at the first step (an ``AssertionError`` in
``sync_and_gather_intermediate_tensors`` on the second stage), so ``generate`` refuses
``pipeline_parallel_size > 1`` with ``device: cpu`` (asserted below).

The TP server is generated from the default spec with only the parallelism (and dtype)
changed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import DEFAULT_SPEC, descendants, start_oracle, start_server
from test_e2e_serving import PROMPTS
from tritonforge.cli import generate as generate_cli
from tritonforge.clients import Client
from typer.testing import CliRunner

TP = 3


def _generate(*args: str) -> Any:
    import typer

    app = typer.Typer()
    generate_cli.register(app)
    return CliRunner().invoke(app, ["generate", *args])


def _spec(tmp: Path, **parallelism: int) -> Path:
    doc = yaml.safe_load(DEFAULT_SPEC.read_text())
    doc["parallelism"] = parallelism
    doc["model"]["dtype"] = "float32"
    doc.setdefault("vllm", {})["engine_args"] = {"distributed_executor_backend": "mp"}
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_pipeline_parallel_on_cpu_is_refused(tmp_path: Path) -> None:
    result = _generate(str(_spec(tmp_path, pipeline_parallel_size=2)), "--output",
                       str(tmp_path / "repo"))
    assert result.exit_code == 2, result.output
    assert "parallelism.pipeline_parallel_size" in result.output
    assert "sync_and_gather_intermediate_tensors" in result.output
    assert not (tmp_path / "repo").exists()


@pytest.mark.server
@pytest.mark.timeout(900)
def test_tensor_parallel_engine_gives_the_single_process_text(tmp_path: Path) -> None:
    oracle = start_oracle({"dtype": "float32"})
    try:
        single = {key: oracle.generate(prompt, temperature=0, max_tokens=n)["text"]
                  for key, (prompt, n) in PROMPTS.items()}
    finally:
        oracle.close()
    repo = tmp_path / "repo"
    result = _generate(str(_spec(tmp_path, tensor_parallel_size=TP)), "--output", str(repo))
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
    print(f"\nprocess names under the TP server: {sorted(set(names))}; "
          f"load average {os.getloadavg()}")
    for key in PROMPTS:
        print(f"{key}: single {single[key]!r} | tp{TP} {parallel[key]!r}")
    assert len(workers) >= TP, names
    assert all(single.values())
    assert parallel == single
