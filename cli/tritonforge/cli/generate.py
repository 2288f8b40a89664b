"""`tritonforge generate` and `tritonforge validate`.

Exit codes: 0 ok; 1 drift (``--check``) or validation failure; 2 bad spec or usage.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from tritonforge.spec.model import Spec

__all__ = ["generate", "register", "validate"]


def _console(stderr: bool = True):  # type: ignore[no-untyped-def]
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def _fail(title: str, lines: list[str], code: int) -> typer.Exit:
    from rich.markup import escape

    con = _console()
    con.print(f"[bold red]error:[/] {escape(title)}")
    for line in lines:
        con.print(f"  - {escape(line)}")
    return typer.Exit(code)


def generate(
    spec: Annotated[Path, typer.Argument(help="Deployment spec (YAML).", metavar="SPEC", show_default=False)],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Model repository folder to "
                                                "write (replaced atomically).", show_default=False)] = None,
    check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 and print a "
                                        "unified diff when OUTPUT (and K8S) differ from what "
                                        "SPEC renders.")] = False,
    k8s: Annotated[Path | None, typer.Option(
        "--k8s", help="Also (or only) write Kubernetes manifests for SPEC to this folder "
        "(replaced atomically; validated offline first). See docs/scaling.md.",
        show_default=False)] = None,
    image: Annotated[str | None, typer.Option(
        "--image", help="With --k8s: the server image (it must have tritonforge installed). "
        "Default: tritonforge-cpu:latest on CPU, tritonforge-vllm:latest / "
        "tritonforge-trtllm:latest on GPU.", show_default=False)] = None,
    namespace: Annotated[str | None, typer.Option(
        "--namespace", help="With --k8s: namespace of every object (default: none set, "
        "kubectl's current one).", show_default=False)] = None,
    min_replicas: Annotated[int, typer.Option("--min-replicas", min=1, max=1000,
                                              help="With --k8s: HPA minimum replicas.")] = 1,
    max_replicas: Annotated[int, typer.Option("--max-replicas", min=1, max=1000,
                                              help="With --k8s: HPA maximum replicas.")] = 4,
    prometheus_url: Annotated[str, typer.Option(
        "--prometheus-url", help="With --k8s: the Prometheus Grafana reads (default: "
        "prometheus-operator's prometheus-operated service).")] = "http://prometheus-operated:9090",
) -> None:
    """Render SPEC into a validated Triton model repository at OUTPUT (and/or Kubernetes
    manifests at K8S)."""
    from tritonforge.render.renderer import render_files
    from tritonforge.render.write import OutputError, ValidationFailed, diff_tree, write_repository
    from tritonforge.spec import SpecError, load_spec

    if output is None and k8s is None:
        raise _fail("give --output DIR (model repository), --k8s DIR (Kubernetes manifests), "
                    "or both", [], 2)
    try:
        parsed = load_spec(spec)
    except SpecError as exc:
        raise _fail(f"invalid spec {spec}", exc.problems, 2) from None
    files = render_files(parsed)
    k8s_files: dict[str, bytes] | None = None
    if k8s is not None:
        k8s_files = _render_k8s(parsed, files, image, namespace, min_replicas, max_replicas,
                                prometheus_url)
    targets = [(d, f) for d, f in ((output, files), (k8s, k8s_files))
               if d is not None and f is not None]
    if check:
        drift = False
        for target, tfiles in targets:
            if target.exists() and not target.is_dir():
                raise _fail(f"{target} is not a folder", [], 2)
            diff = diff_tree(target, tfiles)
            if diff:
                typer.echo(diff, nl=False)
                _console().print(f"[bold red]error:[/] {target} differs from what {spec} renders")
                drift = True
        if drift:
            raise _fail(f"run `tritonforge generate {spec}` with the same folders to update", [], 1)
        _console().print(f"{', '.join(str(t) for t, _ in targets)} up to date with {spec}")
        return
    if output is None:
        _validate_in_temp(files)  # the manifests carry the repository: it must be valid
    for target, tfiles in targets:
        try:
            write_repository(target, tfiles, validate=target == output)
        except OutputError as exc:
            raise _fail(str(exc), [], 2) from None
        except ValidationFailed as exc:
            raise _fail(f"the rendered repository failed validation; {target} is unchanged",
                        [str(p) for p in exc.problems], 1) from None
        except OSError as exc:
            raise _fail(f"cannot write {target}: {exc}; it is unchanged", [], 1) from None
    if output is not None:
        models = sorted({p.split("/")[0] for p in files if p.endswith("/config.pbtxt")})
        _console().print(f"wrote {output}: {', '.join(models)} (served model: {parsed.name})")
    if k8s is not None and k8s_files is not None:
        _console().print(f"wrote {k8s}: {', '.join(p for p in k8s_files if not p.startswith('.'))}")


def _render_k8s(parsed: Spec, files: dict[str, bytes], image: str | None, namespace: str | None,
                min_replicas: int, max_replicas: int, prometheus_url: str) -> dict[str, bytes]:
    """The Kubernetes files, validated; exit 2 on bad options, 1 on a validation failure."""
    from tritonforge.render.k8s import K8sOptions, dns_name, render_k8s, validate_k8s

    bad = []
    if max_replicas < min_replicas:
        bad.append(f"--max-replicas: must be >= --min-replicas ({min_replicas}); got "
                   f"{max_replicas}. Fix: raise it")
    if namespace is not None and dns_name(namespace) != namespace:
        bad.append(f"--namespace: must be a DNS label (lower-case letters, digits, '-'); got "
                   f"{namespace!r}. Fix: use {dns_name(namespace)!r}")
    if image is not None and (not image.strip() or any(c.isspace() for c in image)):
        bad.append(f"--image: must be an image reference without spaces; got {image!r}")
    if not prometheus_url.startswith(("http://", "https://")) or any(
            c.isspace() for c in prometheus_url):
        bad.append(f"--prometheus-url: must be an http(s) URL; got {prometheus_url!r}")
    if bad:
        raise _fail("invalid options", bad, 2)
    opts = K8sOptions(image=image, namespace=namespace, min_replicas=min_replicas,
                      max_replicas=max_replicas, prometheus_url=prometheus_url)
    out = render_k8s(parsed, files, opts)
    problems = validate_k8s(out)
    if problems:
        raise _fail("the Kubernetes manifests failed validation; nothing written",
                    [str(p) for p in problems], 1)
    return out


def _validate_in_temp(files: dict[str, bytes]) -> None:
    import tempfile

    from tritonforge.render.write import ValidationFailed, write_repository

    with tempfile.TemporaryDirectory(prefix="tritonforge-repo-") as tmp:
        try:
            write_repository(Path(tmp) / "repo", files)
        except ValidationFailed as exc:
            raise _fail("the rendered repository failed validation; nothing written",
                        [str(p) for p in exc.problems], 1) from None


def validate(
    directory: Annotated[Path, typer.Argument(help="Model repository folder.", metavar="DIR",
                                              show_default=False)],
) -> None:
    """Check a model repository: configs parse, ensemble wiring, streaming, parameters."""
    from tritonforge.render.validate import validate_repository

    if not directory.is_dir():
        raise _fail(f"{directory} is not a folder", [], 2)
    problems = validate_repository(directory)
    if problems:
        raise _fail(f"{directory}: {len(problems)} problem(s)", [str(p) for p in problems], 1)
    _console().print(f"{directory}: ok")


def register(app: typer.Typer) -> None:
    app.command("generate")(generate)
    app.command("validate")(validate)
