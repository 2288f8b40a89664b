"""Unit tests of the engine metrics' in-memory store (outside Triton)."""

from __future__ import annotations

import math

import pytest
from tritonforge.triton_models import metrics as m
from tritonforge.triton_models.metrics import EngineMetrics
from tritonforge.contract import FinishReason


def _hist(samples: dict[m.SampleKey, float], name: str) -> tuple[dict[float, float], float, float]:
    buckets: dict[float, float] = {}
    total = count = math.nan
    for (series, labels), value in samples.items():
        if series == f"{name}_bucket":
            buckets[float(dict(labels)["le"])] = value
        elif series == f"{name}_sum":
            total = value
        elif series == f"{name}_count":
            count = value
    return buckets, total, count


def test_outside_triton_uses_memory_store() -> None:
    em = EngineMetrics("vllm_engine", "3")
    assert not em.in_triton
    assert em.flush() is True
    em.close()  # no-op outside Triton, must not raise


def test_every_series_exists_at_zero_before_first_request() -> None:
    samples = EngineMetrics("e").samples()
    names = {name for name, _ in samples}
    assert names == m.ENGINE_METRIC_NAMES
    # Everything starts at zero, but the engine is up (1) until it dies.
    assert all(v == (1.0 if name == m.ENGINE_UP else 0.0) for (name, _), v in samples.items())
    for _, labels in samples:
        d = dict(labels)
        assert d["model"] == "e" and d["version"] == "1"
    reasons = {dict(lab)["finish_reason"] for n, lab in samples if n == m.REQUESTS_FINISHED}
    assert reasons == {r.value for r in FinishReason if r.value}


def test_histogram_is_cumulative_with_sum_and_count() -> None:
    em = EngineMetrics("e")
    for v in (0.004, 0.05, 0.05, 0.6, 1000.0):
        em.observe_ttft(v)
    buckets, total, count = _hist(em.samples(), m.TTFT)
    assert count == 5
    assert total == pytest.approx(0.004 + 0.05 + 0.05 + 0.6 + 1000.0)
    assert buckets[0.005] == 1  # 0.004
    assert buckets[0.05] == 3  # le is inclusive: 0.05 falls in le="0.05"
    assert buckets[0.5] == 3
    assert buckets[0.75] == 4
    assert buckets[80.0] == 4
    assert buckets[math.inf] == 5
    values = [buckets[b] for b in sorted(buckets)]
    assert values == sorted(values)
    assert set(buckets) == {*m.TTFT_BUCKETS, math.inf}


def test_each_histogram_has_its_own_buckets() -> None:
    em = EngineMetrics("e")
    em.observe_time_per_output_token(0.02)
    em.observe_e2e(12.0)
    samples = em.samples()
    tpot, _, tpot_n = _hist(samples, m.TIME_PER_OUTPUT_TOKEN)
    e2e, e2e_sum, e2e_n = _hist(samples, m.E2E_LATENCY)
    assert set(tpot) == {*m.TPOT_BUCKETS, math.inf} and tpot_n == 1 and tpot[0.02] == 1
    assert set(e2e) == {*m.E2E_BUCKETS, math.inf} and e2e_n == 1 and e2e_sum == 12.0
    assert e2e[10.0] == 0 and e2e[15.0] == 1
    assert _hist(samples, m.TTFT)[2] == 0


def test_invalid_observations_are_dropped() -> None:
    em = EngineMetrics("e")
    for bad in (-1.0, math.nan, math.inf):
        em.observe_ttft(bad)
    assert em.value(f"{m.TTFT}_count") == 0


def test_counters_gauges_and_finish_reasons() -> None:
    em = EngineMetrics("e")
    em.add_prompt_tokens(10)
    em.add_prompt_tokens(5)
    em.add_prompt_tokens(-3)  # ignored: counters never go down
    em.add_generation_tokens(7)
    em.set_running(4)
    em.set_running(2)
    em.set_waiting(-1)  # clamped
    em.set_kv_cache_usage(1.7)  # clamped to 1
    em.add_request_finished("stop")
    em.add_request_finished("stop")
    em.add_request_finished(FinishReason.LENGTH.value)
    em.add_request_finished("error")  # a reason outside the enum gets its own series
    em.add_request_finished("")
    assert em.value(m.PROMPT_TOKENS) == 15
    assert em.value(m.GENERATION_TOKENS) == 7
    assert em.value(m.REQUESTS_RUNNING) == 2
    assert em.value(m.REQUESTS_WAITING) == 0
    assert em.value(m.KV_CACHE_USAGE) == 1.0
    assert em.value(m.REQUESTS_FINISHED, finish_reason="stop") == 2
    assert em.value(m.REQUESTS_FINISHED, finish_reason="length") == 1
    assert em.value(m.REQUESTS_FINISHED, finish_reason="cancelled") == 0
    assert em.value(m.REQUESTS_FINISHED, finish_reason="error") == 1
    assert em.value(m.REQUESTS_FINISHED, finish_reason="unknown") == 1
    em.set_kv_cache_usage(0.25)
    assert em.value(m.KV_CACHE_USAGE) == 0.25


def test_instances_do_not_share_state() -> None:
    a, b = EngineMetrics("a"), EngineMetrics("b")
    a.add_generation_tokens(3)
    assert b.value(m.GENERATION_TOKENS) == 0
    assert a.value(m.GENERATION_TOKENS) == 3


def test_names_follow_prometheus_conventions() -> None:
    for name in (m.PROMPT_TOKENS, m.GENERATION_TOKENS, m.REQUESTS_FINISHED):
        assert name.endswith("_total")
    for name in m.HISTOGRAMS:
        assert name.endswith("_seconds")
    assert all(n.startswith("tritonforge_engine_") for n in m.ENGINE_METRIC_NAMES)
