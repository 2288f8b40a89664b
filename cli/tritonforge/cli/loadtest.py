"""``tritonforge loadtest``: the common headless Locust run, with a live progress display.

Locust runs in a subprocess (importing it here would monkey-patch this process with
gevent); this command builds its argument list, shows progress from the CSV statistics
Locust writes every few seconds, prints the summary at the end and exits with Locust's
exit code: 0 ok, 1 requests failed, 2 bad settings, 3 an SLO gate failed.

All results land in ``--output``: Locust's CSV files (``locust_*.csv``) and HTML report
(``report.html``), ``summary.json``, the PNG plots and Locust's log (``locust.log``).
"""

from __future__ import annotations

import csv
import enum
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["build_command", "register"]

EXIT_BAD_INPUT = 2


class LoadProtocol(str, enum.Enum):
    grpc = "grpc"
    http = "http"
    http_sync = "http-sync"


class LoadShape(str, enum.Enum):
    constant = "constant"
    ramp = "ramp"
    step = "step"


_DEFAULT_PORT = {"grpc": 8001, "http": 8000, "http-sync": 8000}
_ADDRESS = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*://)?(?P<host>\[[^\]]+\]|[^:/\s]+):(?P<port>\d{1,5})/?$")


class UserError(Exception):
    pass


def _locustfile() -> Path:
    import tritonforge.loadtests as pkg

    return Path(pkg.__file__).resolve().parent / "locustfile.py"


def _check_dataset(ref: str) -> None:
    from tritonforge.loadtests.datasets import BUILTIN_DATASETS, SYNTHETIC_PREFIX

    if ref in BUILTIN_DATASETS:
        return
    if ref.startswith(SYNTHETIC_PREFIX):
        n = ref[len(SYNTHETIC_PREFIX):]
        if n.isdigit() and int(n) >= 1:
            return
        raise UserError(f"--dataset {ref!r}: synthetic:N needs a positive token count N")
    if not Path(ref).expanduser().is_file():
        known = ", ".join([*BUILTIN_DATASETS, "synthetic:N"])
        raise UserError(f"--dataset {ref!r} is neither a shipped dataset ({known}) nor a JSONL file")


def build_command(
    *, protocol: str, url: str | None, model: str | None, users: int, spawn_rate: float,
    duration: float, dataset: str, output: Path, max_tokens: int | None = None,
    shape: str = "constant", slo_ttft_p95_ms: float | None = None,
    slo_itl_p95_ms: float | None = None, max_fail_ratio: float | None = None,
    tokenizer: str | None = None, prometheus_port: int = -1, drain: float = 30.0,
    ignore_eos: bool = False,
) -> list[str]:
    """The Locust command line for one headless run (validated; raises ``UserError``)."""
    if users < 1:
        raise UserError(f"--users must be >= 1, got {users}")
    if not spawn_rate > 0:
        raise UserError(f"--spawn-rate must be > 0, got {spawn_rate:g}")
    if not duration >= 1:
        raise UserError(f"--duration must be >= 1 second, got {duration:g}")
    if max_tokens is not None and max_tokens < 1:
        raise UserError(f"--max-tokens must be >= 1, got {max_tokens}")
    for flag, v, hi in (("--slo-ttft-p95-ms", slo_ttft_p95_ms, None),
                        ("--slo-itl-p95-ms", slo_itl_p95_ms, None),
                        ("--max-fail-ratio", max_fail_ratio, 1.0)):
        if v is not None and (v < 0 or (hi is not None and v > hi)):
            raise UserError(f"{flag} must be {'in [0, 1]' if hi else '>= 0'}, got {v:g}")
    if importlib.util.find_spec("locust") is None:  # found, not imported
        raise UserError("Locust is not installed: pip install 'tritonforge[loadtest]'")
    address = url or f"127.0.0.1:{_DEFAULT_PORT[protocol]}"
    m = _ADDRESS.match(address.strip())
    if not m or not 0 < int(m.group("port")) < 65536:
        raise UserError(f"--url must be HOST:PORT, got {address!r}")
    _check_dataset(dataset)
    target = "--triton-grpc" if protocol == "grpc" else "--triton-http"
    cmd = [
        sys.executable, "-m", "locust", "-f", str(_locustfile()), "--headless",
        "-u", str(users), "-r", f"{spawn_rate:g}", "-t", f"{round(duration)}s",
        "--stop-timeout", f"{drain:g}",
        "--protocol", protocol, target, address.strip(), "--dataset", dataset,
        "--shape", shape, "--csv", str(output / "locust"), "--html", str(output / "report.html"),
        "--results-dir", str(output), "--logfile", str(output / "locust.log"),
        "--prometheus-port", str(prometheus_port), "--only-summary",
    ]
    if model:
        cmd += ["--model", model]
    if max_tokens:
        cmd += ["--max-tokens", str(max_tokens)]
    if ignore_eos:
        if not max_tokens:
            raise UserError("--ignore-eos needs --max-tokens (the exact number of tokens to generate)")
        cmd.append("--ignore-eos")
    if tokenizer:
        cmd += ["--tokenizer", tokenizer]
    for flag, v in (("--slo-ttft-p95-ms", slo_ttft_p95_ms), ("--slo-itl-p95-ms", slo_itl_p95_ms),
                    ("--max-fail-ratio", max_fail_ratio)):
        if v is not None:
            cmd += [flag, f"{v:g}"]
    return cmd


def _live_stats(output: Path) -> dict[str, float]:
    from tritonforge.loadtests.metrics import ENTRY_LATENCY, ENTRY_TTFT

    path = output / "locust_stats.csv"
    out = {"requests": 0.0, "failures": 0.0, "ttft_ms": 0.0, "tokens": 0.0}
    try:
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                if row.get("Name") == ENTRY_LATENCY:
                    n = float(row["Request Count"])
                    out["requests"] += n
                    out["failures"] += float(row["Failure Count"])
                    out["tokens"] += n * float(row.get("Average Content Size") or 0)
                elif row.get("Name") == ENTRY_TTFT:
                    out["ttft_ms"] = max(out["ttft_ms"], float(row["Median Response Time"] or 0))
    except (OSError, ValueError, KeyError):
        pass
    return out


def _print_summary(output: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=False)
    try:
        summary: dict[str, Any] = json.loads((output / "summary.json").read_text())
    except (OSError, ValueError):
        return
    req = summary["requests"]
    table = Table(title=f"{summary['model']} over {summary['protocol']}: {req['succeeded']} ok,"
                        f" {req['failed']} failed")
    for col in ("metric", "p50", "p90", "p95", "p99", "mean"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    for key in ("time_to_first_token_ms", "inter_token_latency_ms", "request_latency_ms"):
        st = summary.get(key)
        if st:
            table.add_row(key, *(f"{st[k]:.1f}" for k in ("p50", "p90", "p95", "p99", "mean")))
    console.print(table)
    console.print(f"output tokens/s {summary['output_token_throughput_per_s']:.2f}   "
                  f"requests/s {summary['request_throughput_per_s']:.3f}   "
                  f"output tokens {summary['output_tokens_total']}")
    for g in summary.get("gates", []):
        value = "nothing measured" if g["value"] is None else f"{g['value']:.4g}"
        style = "green" if g["passed"] else "bold red"
        verdict = "passed" if g["passed"] else "FAILED"
        console.print(f"[{style}]SLO gate {g['gate']} {verdict}: limit {g['limit']:g},"
                      f" measured {value}[/{style}]")
    console.print(f"results in {output}")


def _last_error(output: Path, stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if "error:" in ln.lower()]
    if lines:
        return lines[-1].strip()
    try:
        log = (output / "locust.log").read_text().splitlines()
    except OSError:
        log = []
    errs = [ln for ln in log if "/ERROR/" in ln or "/CRITICAL/" in ln]
    return errs[-1].strip() if errs else ""


def _run(cmd: list[str], output: Path, duration: float) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    env = dict(os.environ)
    env.setdefault("MPLBACKEND", "Agg")
    err_path = output / "locust.stderr"
    with err_path.open("w") as err, subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True
    ) as proc:
        try:
            with Progress(TextColumn("[bold]load test"), BarColumn(), TimeElapsedColumn(),
                          TextColumn("{task.fields[stats]}"), transient=False) as progress:
                task = progress.add_task("run", total=duration, stats="starting Locust ...")
                t0 = time.monotonic()
                while proc.poll() is None:
                    time.sleep(0.5)
                    s = _live_stats(output)
                    stats = (f"{int(s['requests'])} requests, {int(s['failures'])} failed,"
                             f" {int(s['tokens'])} tokens, TTFT p50 {s['ttft_ms']:.0f} ms")
                    progress.update(task, completed=min(duration, time.monotonic() - t0),
                                    stats=stats)
                progress.update(task, completed=duration)
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGTERM)  # Locust writes its reports on SIGTERM
            proc.wait(timeout=60)
        code = proc.returncode
    stderr = err_path.read_text(errors="replace")
    if code == EXIT_BAD_INPUT:
        typer.echo(_last_error(output, stderr) or "error: Locust refused the settings", err=True)
        return code
    _print_summary(output)
    if code not in (0, 1, 3):
        msg = _last_error(output, stderr)
        if msg:
            typer.echo(msg, err=True)
    return int(code)


def register(app: typer.Typer) -> None:
    @app.command("loadtest")
    def loadtest(
        protocol: Annotated[LoadProtocol, typer.Option(
            "--protocol", help="grpc (streaming), http (SSE streaming), http-sync (non-streaming).")] = LoadProtocol.grpc,
        url: Annotated[str | None, typer.Option(
            "--url", help="Server HOST:PORT (default 127.0.0.1:8001 for grpc, :8000 for http).")] = None,
        model: Annotated[str | None, typer.Option(
            "--model", help="Ensemble to load (default: discovered; a local serve's admin key is found by itself, else set TRITONFORGE_ADMIN_KEY).")] = None,
        users: Annotated[int, typer.Option("--users", help="Concurrent users.")] = 8,
        spawn_rate: Annotated[float, typer.Option("--spawn-rate", help="Users started per second.")] = 2.0,
        duration: Annotated[float, typer.Option("--duration", help="Run time, seconds.")] = 60.0,
        dataset: Annotated[str, typer.Option(
            "--dataset", help="short-chat | long-summarization | mixed-zh-en | synthetic:N | a JSONL path.")] = "short-chat",
        output: Annotated[Path, typer.Option(
            "--output", help="Results folder (CSV, HTML, summary.json, plots, log).")] = Path("loadtest-results"),
        max_tokens: Annotated[int | None, typer.Option(
            "--max-tokens", help="Output tokens per request (default: each prompt's own).")] = None,
        ignore_eos: Annotated[bool, typer.Option(
            "--ignore-eos", help="Generate exactly --max-tokens tokens per request (min_tokens = max_tokens).")] = False,
        shape: Annotated[LoadShape, typer.Option("--shape", help="Load shape.")] = LoadShape.constant,
        tokenizer: Annotated[str | None, typer.Option(
            "--tokenizer", help="Tokenizer counting output tokens (default: SmolLM2's).")] = None,
        slo_ttft_p95_ms: Annotated[float | None, typer.Option(
            "--slo-ttft-p95-ms", help="Fail (exit 3) when TTFT p95 exceeds this, ms.")] = None,
        slo_itl_p95_ms: Annotated[float | None, typer.Option(
            "--slo-itl-p95-ms", help="Fail (exit 3) when inter-token latency p95 exceeds this, ms.")] = None,
        max_fail_ratio: Annotated[float | None, typer.Option(
            "--max-fail-ratio", help="Fail (exit 3) when failed/total requests exceeds this.")] = None,
        prometheus_port: Annotated[int, typer.Option(
            "--prometheus-port", help="Serve live metrics for Prometheus on this port (0: free port, -1: off).")] = -1,
    ) -> None:
        """Run a headless Locust load test and report genai-perf's metrics."""
        try:
            cmd = build_command(
                protocol=protocol.value, url=url, model=model, users=users,
                spawn_rate=spawn_rate, duration=duration, dataset=dataset, output=output,
                max_tokens=max_tokens, shape=shape.value, slo_ttft_p95_ms=slo_ttft_p95_ms,
                slo_itl_p95_ms=slo_itl_p95_ms, max_fail_ratio=max_fail_ratio,
                tokenizer=tokenizer, prometheus_port=prometheus_port, ignore_eos=ignore_eos,
            )
            output.mkdir(parents=True, exist_ok=True)
        except UserError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except OSError as exc:
            typer.echo(f"error: cannot create --output {output}: {exc.strerror or exc}", err=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        raise typer.Exit(_run(cmd, output, duration))
