"""Load-test building blocks without a server: metrics, gates, datasets, shapes, CLI input.

Nothing here imports Locust (it would monkey-patch this process with gevent); the Locust
runs themselves are in test_loadtest_server.py, in subprocesses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tritonforge.loadtests import metrics
from tritonforge.loadtests.datasets import (
    BUILTIN_DATASETS,
    DatasetError,
    PromptPool,
    load_dataset,
)
from tritonforge.loadtests.gates import Gates, evaluate
from tritonforge.loadtests.options import SettingsError, settings_from
from tritonforge.loadtests.records import Collector, Record
from tritonforge.loadtests.schedule import shape_target
from tritonforge.loadtests.tokens import TokenizerError, load_token_counter
from typer.testing import CliRunner


@pytest.fixture(scope="module")
def counter():  # type: ignore[no-untyped-def]
    return load_token_counter()


# -- metrics ------------------------------------------------------------------------------
def test_genai_perf_definitions_on_known_records() -> None:
    recs = [
        Record(start=100.0, ttft=0.5, latency=2.5, output_tokens=5, input_tokens=10),
        Record(start=101.0, ttft=0.2, latency=1.2, output_tokens=3, input_tokens=20),
        Record(start=101.5, ttft=None, latency=0.3, output_tokens=0, error="boom"),
    ]
    assert recs[0].itl == pytest.approx((2.5 - 0.5) / 4)
    assert recs[1].itl == pytest.approx((1.2 - 0.2) / 2)
    s = metrics.summarize(recs)
    # duration = last response (102.5) - first request (100.0), successful requests only
    assert s["benchmark_duration_s"] == pytest.approx(2.5)
    assert s["output_tokens_total"] == 8
    assert s["output_token_throughput_per_s"] == pytest.approx(8 / 2.5)
    assert s["request_throughput_per_s"] == pytest.approx(2 / 2.5)
    assert s["requests"] == {"total": 3, "succeeded": 2, "failed": 1, "fail_ratio": pytest.approx(1 / 3)}
    assert s["time_to_first_token_ms"]["p50"] == pytest.approx(350.0)
    assert s["time_to_first_token_ms"]["max"] == pytest.approx(500.0)
    assert s["inter_token_latency_ms"]["mean"] == pytest.approx((500.0 + 500.0) / 2)
    assert s["request_latency_ms"]["p99"] == pytest.approx(1200 + 0.99 * 1300)
    assert s["input_tokens_per_request"]["mean"] == pytest.approx(15.0)
    assert s["errors"] == {"boom": 1}
    for key in metrics.LATENCY_METRICS:
        assert {"p50", "p90", "p95", "p99", "mean", "min", "max", "std"} <= set(s[key])


def test_itl_undefined_for_one_token_and_non_streaming() -> None:
    assert Record(0.0, 0.1, 0.1, 1).itl is None
    assert Record(0.0, 0.4, 0.4, 7, streaming=False).itl is None
    s = metrics.summarize([Record(0.0, 0.4, 0.4, 7, streaming=False)])
    assert s["inter_token_latency_ms"] is None and s["time_to_first_token_ms"]["p50"] == 400.0


def test_empty_run_summary_and_timeline() -> None:
    s = metrics.summarize([])
    assert s["requests"]["total"] == 0 and s["output_token_throughput_per_s"] == 0.0
    assert s["time_to_first_token_ms"] is None
    json.dumps(s, allow_nan=False)
    assert metrics.timeline([]) == {"t": []}


def test_timeline_conserves_tokens() -> None:
    recs = [Record(start=float(i), ttft=0.5, latency=3.0, output_tokens=30) for i in range(10)]
    series = metrics.timeline(recs, bins=6)
    width = series["t"][1] - series["t"][0]
    assert sum(series["tokens_per_s"]) * width == pytest.approx(300.0)
    assert sum(series["requests_per_s"]) * width == pytest.approx(10.0)
    assert len(series["ttft_ms_p95"]) == len(series["t"])


def test_records_round_trip_and_collector_drain() -> None:
    r = Record(1.5, None, 2.0, 0, 3, "x", False)
    assert Record.from_wire(r.to_wire()) == r
    c = Collector()
    c.add(r)
    assert c.drain() == [r] and c.drain() == []
    c.extend([r, r], source="w1")
    assert len(c.records()) == 3 and c.by_source == {"local": 1, "w1": 2}


# -- gates --------------------------------------------------------------------------------
def test_gates_pass_fail_and_nothing_measured() -> None:
    recs = [Record(0.0, 0.2, 1.0, 5), Record(0.0, 0.3, 1.0, 5), Record(0.0, None, 1.0, 0, error="e")]
    s = metrics.summarize(recs)
    res = {g.name: g for g in evaluate(Gates(ttft_p95_ms=1000, itl_p95_ms=0.001, max_fail_ratio=0.5), s)}
    assert res["--slo-ttft-p95-ms"].passed
    assert not res["--slo-itl-p95-ms"].passed and "FAILED" in res["--slo-itl-p95-ms"].message()
    assert res["--max-fail-ratio"].passed and res["--max-fail-ratio"].value == pytest.approx(1 / 3)
    assert not evaluate(Gates(max_fail_ratio=0.2), s)[0].passed
    nothing = evaluate(Gates(ttft_p95_ms=5), metrics.summarize([]))[0]
    assert not nothing.passed and "nothing measured" in nothing.message()
    assert evaluate(Gates(), s) == []


# -- datasets -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(BUILTIN_DATASETS))
def test_shipped_datasets_have_their_documented_length_ranges(name: str, counter) -> None:  # type: ignore[no-untyped-def]
    info = BUILTIN_DATASETS[name]
    prompts = load_dataset(name, counter)
    assert len(prompts) >= 6
    lo, hi = info.input_tokens
    assert all(lo <= p.input_tokens <= hi for p in prompts), [p.input_tokens for p in prompts]
    lo, hi = info.max_tokens
    assert all(p.max_tokens is not None and lo <= p.max_tokens <= hi for p in prompts)
    assert len({p.max_tokens for p in prompts}) >= 2  # a distribution, not one value


def test_mixed_dataset_mixes_chinese_and_english(counter) -> None:  # type: ignore[no-untyped-def]
    for p in load_dataset("mixed-zh-en", counter):
        text = p.text()
        assert any("\u4e00" <= ch <= "\u9fff" for ch in text) and any(ch.isascii() and ch.isalpha() for ch in text)


@pytest.mark.parametrize("n", [1, 17, 256])
def test_synthetic_prompts_have_the_asked_token_length(n: int, counter) -> None:  # type: ignore[no-untyped-def]
    prompts = load_dataset(f"synthetic:{n}", counter, max_tokens=12, seed=3)
    assert prompts and all(p.input_tokens == n and p.max_tokens == 12 for p in prompts)
    # re-encoding the decoded window lands on (about) the same length
    assert all(abs(counter.count(p.text()) - n) <= max(2, n // 20) for p in prompts)
    assert load_dataset(f"synthetic:{n}", counter, seed=3) [0].prompt == prompts[0].prompt


def test_user_jsonl_and_its_errors(tmp_path: Path, counter) -> None:  # type: ignore[no-untyped-def]
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "Hello there", "max_tokens": 7}\n\n'
                    '{"messages": [{"role": "user", "content": "Hi"}]}\n')
    prompts = load_dataset(str(good), counter)
    assert [p.max_tokens for p in prompts] == [7, None]
    assert prompts[0].input_tokens == counter.count("Hello there")
    cases = {
        '{"prompt": "a", "messages": []}': "exactly one of",
        '{"prompt": ""}': "non-empty string",
        '{"prompt": "a", "max_tokens": 0}': "positive integer",
        '{"prompt": "a", "temp": 1}': "unknown keys",
        '{"messages": [{"role": "user"}]}': "'messages' must be",
        "not json": "not valid JSON",
        "[1]": "expected a JSON object",
    }
    for line, msg in cases.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"prompt": "ok"}\n' + line + "\n")
        with pytest.raises(DatasetError, match=msg) as info:
            load_dataset(str(bad), counter)
        assert f"{bad}:2" in str(info.value)
    with pytest.raises(DatasetError, match="neither a shipped dataset"):
        load_dataset("no-such-set", counter)
    with pytest.raises(DatasetError, match=r"synthetic:N needs N"):
        load_dataset("synthetic:0", counter)


def test_prompt_pool_cycles_in_a_seeded_order(counter) -> None:  # type: ignore[no-untyped-def]
    prompts = load_dataset("short-chat", counter)
    a, b = PromptPool(prompts, seed=1), PromptPool(prompts, seed=1)
    seq = [a.next().id for _ in range(2 * len(prompts))]
    assert seq == [b.next().id for _ in range(2 * len(prompts))]
    assert sorted(seq[: len(prompts)]) == sorted(p.id for p in prompts)
    with pytest.raises(DatasetError):
        PromptPool([])


def test_fast_counter_matches_the_served_models_tokenizer(counter) -> None:  # type: ignore[no-untyped-def]
    from tritonforge.triton_models.preprocess import load_tokenizer

    reference = load_tokenizer("package:smollm2-135m-instruct")  # transformers, as served
    for name in sorted(BUILTIN_DATASETS):
        for p in load_dataset(name, counter)[:4]:
            assert counter.encode(p.text()) == reference.encode(p.text(), add_special_tokens=False)


def test_tokenizer_json_alone_counts_like_the_model_reference(tmp_path: Path, counter) -> None:  # type: ignore[no-untyped-def]
    from tritonforge.runtime.models import resolve_model

    src = resolve_model("package:smollm2-135m-instruct") / "tokenizer.json"
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_bytes(src.read_bytes())
    text = "Mixed text: 你好, world! 12345"
    for ref in (str(tmp_path / "tok"), str(tmp_path / "tok" / "tokenizer.json")):
        assert load_token_counter(ref).encode(text) == counter.encode(text)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(TokenizerError, match="cannot read"):
        load_token_counter(str(tmp_path / "bad.json"))


def test_tokenizer_setting_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="unknown packaged model"):
        load_token_counter("package:nope")
    with pytest.raises(TokenizerError):
        load_token_counter(str(tmp_path / "missing"))


# -- shapes and options -------------------------------------------------------------------
def test_shape_targets() -> None:
    assert shape_target("constant", 5, 8, 60) == 8
    assert shape_target("constant", 60, 8, 60) is None
    ramp = [shape_target("ramp", t, 8, 40, ramp_seconds=10) for t in range(0, 41, 5)]
    assert ramp == [1, 4, 8, 8, 8, 8, 8, 4, None]
    step = [shape_target("step", t, 7, 100, step_users=2, step_seconds=10) for t in (0, 9, 10, 25, 35, 99)]
    assert step == [2, 2, 4, 6, 7, 7]


class _Opts:
    def __init__(self, **kw: object) -> None:
        self.__dict__.update(kw)


def test_settings_validation() -> None:
    s = settings_from(_Opts(model="m", triton_grpc="h:1", triton_http="http://h:2/", max_tokens=0))
    assert s.sync_model == "m_sync" and s.http_url == "h:2" and s.max_tokens is None
    for kw, msg in (({"triton_grpc": "nohost"}, "--triton-grpc"),
                    ({"max_fail_ratio": 1.5}, "--max-fail-ratio"),
                    ({"slo_ttft_p95_ms": -1.0}, "--slo-ttft-p95-ms"),
                    ({"request_timeout": 0.0}, "--request-timeout")):
        with pytest.raises(SettingsError, match=msg):
            settings_from(_Opts(**kw))


# -- CLI input errors: one line, exit 2, no traceback, Locust never started -------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--users", "0"], "--users must be >= 1"),
        (["--spawn-rate", "0"], "--spawn-rate must be > 0"),
        (["--duration", "0"], "--duration must be >= 1"),
        (["--url", "nonsense"], "--url must be HOST:PORT"),
        (["--dataset", "nope"], "neither a shipped dataset"),
        (["--dataset", "synthetic:x"], "synthetic:N"),
        (["--max-fail-ratio", "2"], "--max-fail-ratio must be in [0, 1]"),
        (["--slo-ttft-p95-ms", "-3"], "--slo-ttft-p95-ms must be >= 0"),
    ],
)
def test_cli_user_errors(args: list[str], message: str, tmp_path: Path) -> None:
    from tritonforge.cli import _register_all, app

    _register_all()
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["loadtest", "--output", str(out), *args])
    assert res.exit_code == 2, res.output
    text = res.output.strip()
    assert message in text and "Traceback" not in text and len(text.splitlines()) == 1
    assert not out.exists()


def test_cli_builds_the_locust_command(tmp_path: Path) -> None:
    from tritonforge.cli.loadtest import build_command

    cmd = build_command(protocol="http", url="10.0.0.1:9000", model="m", users=3, spawn_rate=1.5,
                        duration=20, dataset="mixed-zh-en", output=tmp_path, max_tokens=9,
                        slo_ttft_p95_ms=250.0, max_fail_ratio=0.0)
    joined = " ".join(cmd)
    assert cmd[1:3] == ["-m", "locust"] and "--headless" in cmd
    for part in ("-u 3", "-r 1.5", "-t 20s", "--protocol http", "--triton-http 10.0.0.1:9000",
                 "--model m", "--max-tokens 9", "--slo-ttft-p95-ms 250", "--max-fail-ratio 0",
                 f"--csv {tmp_path / 'locust'}", f"--html {tmp_path / 'report.html'}"):
        assert part in joined
    assert "--slo-itl-p95-ms" not in cmd
    assert Path(cmd[cmd.index("-f") + 1]).name == "locustfile.py"


def test_locust_was_never_imported_here() -> None:
    # runs last in this file: the pure modules and the CLI must not import Locust
    assert "locust" not in sys.modules
