"""`response_cache: true` works end to end: `tritonforge serve SPEC` starts Triton with a cache.

The spec is the default one plus ``response_cache: true``; ``serve`` renders it and must
start tritonserver with ``--cache-config`` (Triton caches nothing without a cache). The
oracle is Triton's own cache metrics (``nv_cache_num_hits_per_model`` /
``nv_cache_num_misses_per_model``): a repeated identical non-streamed request to the
``_sync`` model is a hit and returns byte-identical output; streamed requests to the
decoupled ensemble never touch the cache (Triton refuses caching decoupled models).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import metric, serve_spec

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.server


def _metric(metrics_url: str, name: str, model: str) -> float:
    return metric(metrics_url, name, model=model)


@pytest.fixture(scope="module")
def cached_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("response-cache")
    spec = yaml.safe_load((ROOT / "deployments" / "default.yaml").read_text())
    spec["name"] = "cached"
    spec["response_cache"] = True
    with serve_spec(spec, tmp, "cached") as addresses:
        yield {**addresses, "model": "cached"}


def _post(url: str, body: dict[str, Any]) -> bytes:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return bytes(r.read())


def test_repeated_non_streamed_request_is_a_cache_hit(cached_server: dict[str, Any]) -> None:
    sync = f"{cached_server['model']}_sync"
    metrics = cached_server["metrics"]
    hits0 = _metric(metrics, "nv_cache_num_hits_per_model", sync)
    misses0 = _metric(metrics, "nv_cache_num_misses_per_model", sync)
    body = {"text_input": "Name three colours.", "max_tokens": 24, "temperature": 0.0}
    url = f"http://{cached_server['http']}/v2/models/{sync}/generate"
    first = _post(url, body)
    assert json.loads(first)["text_output"], first
    assert _metric(metrics, "nv_cache_num_misses_per_model", sync) == misses0 + 1
    second = _post(url, body)
    assert second == first  # byte-identical: the cached response
    assert _metric(metrics, "nv_cache_num_hits_per_model", sync) == hits0 + 1
    # A different request is a miss again, with its own answer.
    third = _post(url, dict(body, text_input="The capital of France is"))
    assert third != first
    assert _metric(metrics, "nv_cache_num_misses_per_model", sync) == misses0 + 2
    assert _metric(metrics, "nv_cache_num_hits_per_model", sync) == hits0 + 1


def test_streamed_requests_never_touch_the_cache(cached_server: dict[str, Any]) -> None:
    model, metrics = cached_server["model"], cached_server["metrics"]
    before = {(m, k): _metric(metrics, f"nv_cache_num_{k}_per_model", m)
              for m in (model, f"{model}_sync") for k in ("hits", "misses")}
    url = f"http://{cached_server['http']}/v2/models/{model}/generate_stream"
    bodies = [_post(url, {"id": f"s{i}", "text_input": "Name three colours.", "max_tokens": 8,
                          "temperature": 0.0}) for i in range(2)]
    assert all(b"data:" in b for b in bodies)
    after = {(m, k): _metric(metrics, f"nv_cache_num_{k}_per_model", m)
             for m in (model, f"{model}_sync") for k in ("hits", "misses")}
    assert after == before
