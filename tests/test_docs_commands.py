"""Every shell command in README.md and docs/*.md runs, as a newcomer pastes it.

The commands are taken from the fenced ``bash`` / ``sh`` / ``console`` blocks (``$ `` lines
for console), in document order: README first, then docs/ by name. Each runs in the
checkout with ``.venv/bin`` first on ``PATH`` (what ``source .venv/bin/activate`` gives)
and without any ``TRITONFORGE_*`` setting in the environment (no admin key: local commands
must find the model themselves), on the default ports, exactly as written: nothing is
substituted. A command fails the test when it exits non-zero or prints a Python traceback.

Commands that keep running (``tritonforge serve``, ``tritonforge gateway``, anything ending
in ``&``) are started in the background and waited for (``serve``: its "serving" line, the
gateway: its port); they serve the commands after them. A new ``serve`` first stops the one
before it (Ctrl-C, exit code 0 required); the last ones are stopped the same way at the end.

A block preceded by ``<!-- not-run: REASON -->`` is not run (a GPU, Docker, other machines),
nor is the README's second command, ``scripts/test.sh`` (this suite itself, which CI runs).
Each of those is still checked for what can be checked here: bash parses it, the files of
this checkout it names exist, and every ``--option`` it gives ``tritonforge``, a script of
this checkout or ``locust`` is one that program's ``--help`` lists.

The default ports (HTTP 8000, gRPC 8001, metrics 8002, gateway 8080) must be free: the test
fails, and says so, when something else holds them.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
VENV_BIN = Path(sys.executable).parent
SHELLS = {"bash", "sh", "shell", "console"}
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.+?)\s*-->")
DEFAULT_PORTS = (8000, 8001, 8002, 8080)
SELF = "scripts/test.sh"  # the README's test command: this suite
READY_TIMEOUT = 900.0
COMMAND_TIMEOUT = 900.0


def _without_comment(text: str) -> str:
    """The command without a trailing ``# comment`` (a ``#`` outside quotes after a blank)."""
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip()
    return text.rstrip()


@dataclass
class Command:
    doc: str
    line: int
    text: str
    skip: str = ""

    @property
    def bare(self) -> str:
        return _without_comment(self.text)

    @property
    def id(self) -> str:
        words = re.sub(r"\s+", " ", self.text)[:50]
        return f"{self.doc}:{self.line}:{words}"

    @property
    def background(self) -> bool:
        t = self.bare
        return t.endswith("&") or bool(re.search(r"\btritonforge (serve|gateway)\b", t)) and (
            "--exit-after-ask" not in t)

    @property
    def kind(self) -> str:
        return "serve" if re.search(r"\btritonforge serve\b", self.text) else "other"


def _commands() -> list[Command]:
    out: list[Command] = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"^```(\w+)?", lines[i])
            if not m:
                i += 1
                continue
            lang, start = (m.group(1) or ""), i
            i += 1
            body: list[tuple[int, str]] = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append((i + 1, lines[i]))
                i += 1
            i += 1
            if lang not in SHELLS:
                continue
            before = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
            marker = NOT_RUN.search(before)
            skip = f"not run ({marker.group(1)})" if marker else ""
            out.extend(_split(path.relative_to(ROOT).as_posix(), body, lang == "console", skip))
    return out


def _split(doc: str, body: list[tuple[int, str]], console: bool, skip: str) -> list[Command]:
    cmds: list[Command] = []
    pending: list[str] = []
    first = 0
    for lineno, raw in body:
        text = raw.rstrip()
        if not pending:
            if console:
                if not text.startswith("$ "):
                    continue
                text = text[2:]
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            first = lineno
        if text.endswith("\\"):
            pending.append(text[:-1])
            continue
        pending.append(text)
        cmds.append(Command(doc, first, " ".join(p.strip() for p in pending), skip))
        pending = []
    return cmds


COMMANDS = _commands()
RUN_HERE = [c for c in COMMANDS if not c.skip and c.bare != SELF]
NOT_RUN_HERE = [c for c in COMMANDS if c.skip or c.bare == SELF]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITONFORGE_")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("VIRTUAL_ENV", None)
    return env


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Running:
    cmd: Command
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """Ctrl-C (to the process group, as a terminal does); exit 0 and no traceback."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
                raise AssertionError(f"{self.cmd.id}: did not stop within 120 s of Ctrl-C") from None
        # A shell that backgrounded its command (`... &`) is gone; its children share the group.
        for _ in range(240):
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        else:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise AssertionError(f"{self.cmd.id}: its processes outlived Ctrl-C by 120 s")
        out = self.output()
        assert "Traceback (most recent call last)" not in out, f"{self.cmd.id}:\n{out[-3000:]}"
        assert self.proc.returncode == 0, f"{self.cmd.id}: exit {self.proc.returncode}\n{out[-3000:]}"


@dataclass
class Session:
    running: list[Running] = field(default_factory=list)

    def start(self, cmd: Command, logdir: Path) -> Running:
        log = logdir / f"bg-{len(self.running)}.log"
        text = cmd.bare.removesuffix("&").rstrip()  # run in the foreground of its own group
        proc = subprocess.Popen(["bash", "-c", text], cwd=ROOT, env=_env(), stdin=subprocess.DEVNULL,
                                stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        run = Running(cmd, proc, log)
        self.running.append(run)
        deadline = time.monotonic() + READY_TIMEOUT
        port = re.search(r"--port\s+(\d+)", text)
        while time.monotonic() < deadline:
            out = run.output()
            assert "Traceback (most recent call last)" not in out, f"{cmd.id}:\n{out[-3000:]}"
            if cmd.kind == "serve" and "serving; Ctrl-C to stop" in out:
                return run
            if cmd.kind != "serve" and _listening(int(port.group(1)) if port else 8080):
                return run
            if proc.poll() is not None:
                raise AssertionError(f"{cmd.id}: exited {proc.returncode} before serving\n{out[-3000:]}")
            time.sleep(0.5)
        raise AssertionError(f"{cmd.id}: not ready in {READY_TIMEOUT:.0f} s\n{run.output()[-3000:]}")

    def stop(self, kind: str | None = None) -> None:
        keep, stop = [], []
        for r in self.running:
            (stop if kind is None or r.cmd.kind == kind else keep).append(r)
        self.running = keep
        errors = []
        for r in reversed(stop):
            try:
                r.stop()
            except AssertionError as exc:
                errors.append(str(exc))
        assert not errors, "\n".join(errors)


@pytest.fixture(scope="module")
def session() -> Session:
    s = Session()
    yield s  # type: ignore[misc]
    s.stop()


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("docs-commands")


def test_the_docs_have_commands() -> None:
    runnable = RUN_HERE
    assert len(runnable) >= 10, [c.id for c in COMMANDS]
    assert any("tritonforge serve" in c.text for c in runnable)
    assert any(re.search(r"tritonforge complete", c.text) for c in runnable)
    assert all(not c.skip or c.skip.startswith("not run (") for c in COMMANDS)


def test_default_ports_are_free(session: Session) -> None:
    busy = [p for p in DEFAULT_PORTS if _listening(p)]
    assert not busy, (f"ports {busy} are in use: the documented commands use the default ports; "
                      "stop what listens there (a `tritonforge serve`?) and run again")


@pytest.mark.parametrize("cmd", RUN_HERE, ids=[c.id for c in RUN_HERE])
def test_documented_command(cmd: Command, session: Session, logdir: Path) -> None:
    if cmd.background:
        if cmd.kind == "serve":
            session.stop("serve")  # one server on the default ports at a time
        else:
            session.stop("other")
        session.start(cmd, logdir)
        return
    done = subprocess.run(["bash", "-c", cmd.text], cwd=ROOT, env=_env(), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
    out = done.stdout + done.stderr
    assert "Traceback (most recent call last)" not in out, f"{cmd.id}:\n{out[-3000:]}"
    assert done.returncode == 0, f"{cmd.id}: exit {done.returncode}\n{out[-3000:]}"


def test_background_commands_stop_cleanly(session: Session) -> None:
    assert session.running, "no documented server was left running to stop"
    session.stop()


# A path of this checkout named by a command (``benchmarks/x.py``, ``deployments/y.yaml``, ...).
_CHECKOUT_PATH = re.compile(r"^(?:\.venv/bin/|\./)?((?:benchmarks|deployments|docs|loadtests|scripts|tests|"
                            r"deploy|model_repository)/[\w./-]+)$")


_LOCUST_HELP = f"""
import subprocess, sys, configargparse
from tritonforge.loadtests.options import add_arguments
parser = configargparse.ArgumentParser()
add_arguments(parser)
parser.print_help()
sys.exit(subprocess.run([{str(VENV_BIN / "locust")!r}, "--help"]).returncode)
"""


def _programs(words: list[str]) -> list[tuple[list[str], list[str]]]:
    """(the ``--help`` command, the options given) for each program of this checkout (or
    locust) that ``words`` run; options end at a shell operator."""
    out = []
    for i, word in enumerate(words):
        if Path(word).name == "tritonforge":
            base = [str(VENV_BIN / "tritonforge"), words[i + 1]]
        elif word.endswith(".py") and _CHECKOUT_PATH.match(word) and Path(words[i - 1]).name.startswith("python"):
            base = [sys.executable, str(ROOT / _CHECKOUT_PATH.match(word).group(1))]  # type: ignore[union-attr]
        elif Path(word).name == "locust":
            # locust's own options, and the ones tritonforge's locustfile registers on its parser
            # (locust prints its help before it loads a locustfile)
            base = [sys.executable, "-c", _LOCUST_HELP]
        else:
            continue
        options = []
        for w in words[i + 1:]:
            if w in {"|", "&&", "||", ";", "&"}:
                break
            if w.startswith("--"):
                options.append(w.split("=", 1)[0])
        out.append(([*base, "--help"], options))
    return out


@pytest.mark.parametrize("cmd", NOT_RUN_HERE, ids=[c.id for c in NOT_RUN_HERE])
def test_command_not_run_here_is_well_formed(cmd: Command) -> None:
    """What can be checked of a documented command that cannot run here (see the docstring)."""
    parsed = subprocess.run(["bash", "-n", "-c", cmd.bare], capture_output=True, text=True, check=False)
    assert parsed.returncode == 0, f"{cmd.id}: bash cannot parse it: {parsed.stderr}"
    words = shlex.split(cmd.bare.removesuffix("&"))
    for word in words:
        m = _CHECKOUT_PATH.match(word.split("=", 1)[-1])
        if m and not word.startswith(("/", "$")):
            assert (ROOT / m.group(1)).exists(), f"{cmd.id}: names {m.group(1)}, which is not in the checkout"
    for help_cmd, options in _programs(words):
        shown = subprocess.run(help_cmd, cwd=ROOT, env=_env(), capture_output=True, text=True,
                               timeout=120, check=False)
        text = re.sub(r"\x1b\[[0-9;]*m", "", shown.stdout + shown.stderr)
        assert shown.returncode == 0, f"{cmd.id}: {' '.join(help_cmd)} exited {shown.returncode}\n{text[-2000:]}"
        unknown = [o for o in options if not re.search(re.escape(o) + r"(?![\w-])", text)]
        assert not unknown, f"{cmd.id}: {help_cmd[1] if len(help_cmd) > 2 else help_cmd[0]} has no {unknown}"
