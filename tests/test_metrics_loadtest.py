"""The load-test Prometheus exporter: served over real HTTP, parsed with the Prometheus parser."""

from __future__ import annotations

import math
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tritonforge.loadtests import prom
from tritonforge.loadtests.prom import Exporter, start_exporter


def _scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def test_exporter_serves_all_series_on_loopback() -> None:
    with start_exporter(0, model="ens", host="127.0.0.1") as exp:
        assert exp.port > 0
        assert exp.url == f"http://127.0.0.1:{exp.port}/metrics"
        exp.observe_ttft(0.2)
        exp.observe_ttft(0.04)
        exp.observe_itl(0.03)
        exp.add_output_tokens(12)
        exp.add_output_tokens(0)
        exp.add_output_tokens(-5)
        exp.add_request(success=True)
        exp.add_request(success=True)
        exp.add_request(success=False)
        exp.set_users(8)
        got = _scrape(exp.url)
    names = {n for n, _ in got}
    assert prom.LOADTEST_METRIC_NAMES <= names
    model = ("model", "ens")
    assert got[(prom.METRIC_OUTPUT_TOKENS, frozenset({model}))] == 12
    assert got[(prom.METRIC_REQUESTS, frozenset({model, ("outcome", "success")}))] == 2
    assert got[(prom.METRIC_REQUESTS, frozenset({model, ("outcome", "failure")}))] == 1
    assert got[(prom.METRIC_USERS, frozenset({model}))] == 8
    assert got[(f"{prom.METRIC_TTFT}_count", frozenset({model}))] == 2
    assert got[(f"{prom.METRIC_TTFT}_sum", frozenset({model}))] == pytest.approx(0.24)
    assert got[(f"{prom.METRIC_TTFT}_bucket", frozenset({model, ("le", "0.05")}))] == 1
    assert got[(f"{prom.METRIC_TTFT}_bucket", frozenset({model, ("le", "+Inf")}))] == 2
    assert got[(f"{prom.METRIC_ITL}_count", frozenset({model}))] == 1
    assert exp.url == ""  # closed


def test_close_stops_serving() -> None:
    exp = start_exporter(0, host="127.0.0.1")
    url = exp.url
    _scrape(url)
    exp.close()
    with pytest.raises(OSError):
        _scrape(url)
    exp.add_request(success=True)  # recording still works after close


def test_port_in_use_raises_oserror() -> None:
    with start_exporter(0, host="127.0.0.1") as exp, pytest.raises(OSError):
        start_exporter(exp.port, host="127.0.0.1")


def test_exporters_have_separate_registries() -> None:
    a, b = Exporter(model="a"), Exporter(model="b")
    a.add_output_tokens(4)
    assert a.registry.get_sample_value(prom.METRIC_OUTPUT_TOKENS, {"model": "a"}) == 4
    assert b.registry.get_sample_value(prom.METRIC_OUTPUT_TOKENS, {"model": "b"}) == 0
    assert b.registry.get_sample_value(prom.METRIC_OUTPUT_TOKENS, {"model": "a"}) is None


def test_negative_and_nan_observations_do_not_corrupt_histograms() -> None:
    exp = Exporter()
    exp.observe_itl(-0.5)  # clock skew: recorded as 0, never a negative sum
    assert exp.registry.get_sample_value(f"{prom.METRIC_ITL}_sum", {"model": ""}) == 0
    exp.observe_itl(math.nan)
    exp.observe_ttft(math.inf)
    assert exp.registry.get_sample_value(f"{prom.METRIC_ITL}_count", {"model": ""}) == 1
    assert exp.registry.get_sample_value(f"{prom.METRIC_TTFT}_count", {"model": ""}) == 0
