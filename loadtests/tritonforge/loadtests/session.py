"""Per-process state of a load test and the Locust event handlers that drive it.

Roles: a *local* run (no ``--master``/``--worker``) does everything in one process. In a
distributed run, *workers* run the users and ship their records to the master inside
Locust's periodic worker report (``report_to_master`` -> ``worker_report``); the *master*
merges them, serves the Prometheus exporter (``prom.py``), and at the end writes the
summary, the plots and applies the SLO gates (setting ``environment.process_exit_code``).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tritonforge.loadtests import metrics, report
from tritonforge.loadtests.datasets import DatasetError, cached_prompts
from tritonforge.loadtests.gates import GATE_EXIT_CODE, evaluate
from tritonforge.loadtests.options import Protocol, Settings, SettingsError, settings_from
from tritonforge.loadtests.records import Collector, Record
from tritonforge.loadtests.tokens import TokenizerError, load_token_counter

__all__ = ["REPORT_KEY", "STATE", "SessionState", "wire"]

log = logging.getLogger("tritonforge.loadtest")

REPORT_KEY: Final = "tritonforge_records"
USER_CLASSES: Final[dict[Protocol, tuple[str, ...]]] = {
    Protocol.GRPC: ("GrpcStreamUser",),
    Protocol.HTTP: ("HttpStreamUser",),
    Protocol.HTTP_SYNC: ("HttpGenerateUser",),
    Protocol.ALL: ("GrpcStreamUser", "HttpStreamUser", "HttpGenerateUser"),
}


@dataclass
class SessionState:
    settings: Settings | None = None
    role: str = "local"  # local | master | worker
    collector: Collector = field(default_factory=Collector)
    exporter: Any = None  # prom.Exporter on the master / local process
    started_at: float = 0.0

    def record(self, rec: Record) -> None:
        """Called by the users for every finished request."""
        self.collector.add(rec)
        if self.role == "local":
            self._export([rec])

    def _export(self, records: list[Record]) -> None:
        exp = self.exporter
        if exp is None:
            return
        for r in records:
            exp.add_request(r.ok)
            if r.ok:
                if r.ttft is not None:
                    exp.observe_ttft(r.ttft)
                if r.itl is not None:
                    exp.observe_itl(r.itl)
                exp.add_output_tokens(r.output_tokens)


STATE: Final = SessionState()


def _fail(msg: str) -> None:
    """A user error at start-up: one clear line, exit 2, no traceback."""
    sys.stderr.write(f"tritonforge loadtest: error: {msg}\n")
    sys.stderr.flush()
    sys.exit(2)


def _discover_model(s: Settings) -> str:
    """The one ensemble the server serves, asked on the address the run loads: over HTTP
    for the HTTP users, over gRPC otherwise."""
    from tritonforge.clients import Client, TritonForgeError

    http = s.protocol.value in ("http", "http-sync")
    url = s.http_url if http else s.grpc_url
    try:
        with Client(url, protocol="http" if http else "grpc", timeout=10, connect_retries=0) as client:
            return client.resolve_model()  # a local serve's admin key is found by the client
    except TritonForgeError as exc:
        raise SettingsError(f"no model given and discovery at {url} failed ({exc});"
                            " pass --model NAME or set TRITONFORGE_MODEL") from None


def _check(s: Settings) -> None:
    """Load what the users will need, so a bad setting fails before any user starts."""
    load_token_counter(s.tokenizer)
    cached_prompts(s.dataset, s.tokenizer, max_tokens=s.max_tokens, seed=s.prompt_seed)


def _results_dir(opts: Any, s: Settings) -> Path | None:
    if s.results_dir:
        return Path(s.results_dir)
    prefix = getattr(opts, "csv_prefix", None)
    if prefix:
        return Path(prefix).parent
    return None


def _finish(environment: Any) -> None:
    s = STATE.settings
    if s is None:
        return
    if STATE.exporter is not None:
        STATE.exporter.close()
    records = STATE.collector.records()
    summary: dict[str, Any] = {
        "schema": "tritonforge.loadtest.summary/1",
        "model": s.model,
        "protocol": s.protocol.value,
        "dataset": s.dataset,
        "tokenizer": s.tokenizer,
        "shape": s.shape.value,
        "started_at": STATE.started_at,
        "users": int(getattr(environment.parsed_options, "num_users", 0) or 0),
        **metrics.summarize(records),
    }
    summary["workers"] = {
        "count": len([k for k in STATE.collector.by_source if k != "local"]),
        "records_by_worker": {k: v for k, v in STATE.collector.by_source.items() if k != "local"},
    }
    results = evaluate(s.gates, summary)
    summary["gates"] = [g.to_dict() for g in results]
    folder = _results_dir(environment.parsed_options, s)
    if folder is not None:
        try:
            files = [report.write_summary(folder, summary)]
            files += report.plot(folder, metrics.timeline(records), f"{s.model} ({s.protocol.value})")
            log.info("tritonforge: wrote %s", ", ".join(str(f) for f in files))
        except OSError as exc:
            log.error("tritonforge: cannot write the results to %s: %s", folder, exc)
            environment.process_exit_code = 2
    _print_summary(summary)
    for g in results:
        (log.info if g.passed else log.error)("tritonforge: %s", g.message())
    if any(not g.passed for g in results):
        environment.process_exit_code = GATE_EXIT_CODE
    elif s.gates.max_fail_ratio is not None and environment.process_exit_code is None:
        environment.process_exit_code = 0  # failures within the allowed ratio are fine


def _print_summary(summary: dict[str, Any]) -> None:
    req = summary["requests"]
    lines = [
        (f"tritonforge summary: {req['succeeded']} ok / {req['failed']} failed requests,"
         f" {summary['output_tokens_total']} output tokens in {summary['benchmark_duration_s']:.2f} s"),
        (f"  output token throughput {summary['output_token_throughput_per_s']:.2f} tok/s,"
         f" request throughput {summary['request_throughput_per_s']:.3f} req/s,"
         f" workers {summary['workers']['count']}"),
    ]
    for key in metrics.LATENCY_METRICS:
        st = summary.get(key)
        if st:
            lines.append(f"  {key}: p50 {st['p50']:.1f}  p90 {st['p90']:.1f}  p95 {st['p95']:.1f}"
                         f"  p99 {st['p99']:.1f}  mean {st['mean']:.1f}")
    for line in lines:
        log.info(line)


def wire(events: Any) -> None:
    """Attach the handlers to Locust's ``events`` (called once by the locustfile)."""
    from tritonforge.loadtests import options

    def _args(parser: Any) -> None:
        options.add_arguments(parser)

    def _init(environment: Any, **_kw: Any) -> None:
        from locust.runners import MasterRunner, WorkerRunner

        runner = environment.runner
        STATE.role = ("master" if isinstance(runner, MasterRunner)
                      else "worker" if isinstance(runner, WorkerRunner) else "local")
        opts = environment.parsed_options
        if opts is None:  # used as a library: nothing to parse
            return
        try:
            s = settings_from(opts)
            if STATE.role != "worker":
                if not getattr(opts, "user_classes", None):
                    wanted = set(USER_CLASSES[s.protocol])
                    # --protocol picks among the shipped users; others always run
                    environment.user_classes[:] = [
                        c for c in environment.user_classes
                        if c.__module__ != "tritonforge.loadtests.users" or c.__name__ in wanted
                    ]
                if not s.model and any(getattr(c, "model", None) is None
                                       for c in environment.user_classes):
                    s = settings_from(_set(opts, model=_discover_model(s)))
            # Load the tokenizer and prompts now (cached): done while spawning, this CPU
            # work would stall a worker's heartbeats and the master would drop it.
            _check(s)
        except (SettingsError, DatasetError, TokenizerError) as exc:
            _fail(str(exc))
        STATE.settings = s
        if STATE.role == "worker":
            return
        if s.prometheus_port >= 0:
            from tritonforge.loadtests.prom import start_exporter

            try:
                STATE.exporter = start_exporter(s.prometheus_port, model=s.model)
                log.info("tritonforge: Prometheus metrics at %s", STATE.exporter.url)
            except OSError as exc:
                log.warning("tritonforge: Prometheus exporter not started on port %s: %s",
                            s.prometheus_port, exc)
            else:
                import gevent  # type: ignore[import-untyped]

                def users_gauge() -> None:
                    while True:
                        STATE.exporter.set_users(environment.runner.user_count)
                        gevent.sleep(1.0)

                gevent.spawn(users_gauge)

    def _start(environment: Any, **_kw: Any) -> None:
        STATE.collector.clear()
        STATE.started_at = time.time()
        if STATE.role == "worker" and environment.parsed_options is not None:
            try:  # the master's options arrived with the spawn message
                STATE.settings = settings_from(environment.parsed_options)
            except SettingsError as exc:
                log.error("tritonforge: %s", exc)

    def _to_master(client_id: str, data: dict[str, Any]) -> None:
        data[REPORT_KEY] = [r.to_wire() for r in STATE.collector.drain()]

    def _from_worker(client_id: str, data: dict[str, Any]) -> None:
        rows = data.get(REPORT_KEY) or []
        records = [Record.from_wire(row) for row in rows]
        STATE.collector.extend(records, source=client_id)
        STATE._export(records)

    def _quitting(environment: Any, **_kw: Any) -> None:
        if STATE.role == "worker":
            return
        if getattr(environment.parsed_options, "csv_prefix", None):
            import gevent

            # Locust rewrites its CSV files every second and never at exit: let it write
            # once more, so requests finished while draining are in the CSV too.
            gevent.sleep(1.2)
        _finish(environment)

    events.init_command_line_parser.add_listener(_args)
    events.init.add_listener(_init)
    events.test_start.add_listener(_start)
    events.report_to_master.add_listener(_to_master)
    events.worker_report.add_listener(_from_worker)
    events.quitting.add_listener(_quitting)


def _set(opts: Any, **values: Any) -> Any:
    for k, v in values.items():
        setattr(opts, k, v)
    return opts
