"""`tritonforge serve` defaults: loopback only, admin APIs closed without the key.

The session server listens on 127.0.0.1 only (read from /proc/net/tcp{,6} for its three
ports), and Triton's model-repository, statistics, trace, logging and shared-memory APIs
refuse requests without header ``admin-key`` (HTTP) / metadata
``triton-grpc-protocol-admin-key`` (gRPC), and accept them with it. Inference and health
stay open. The launcher's defaults are checked too: its command binds loopback and restricts
the groups unless told otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from tritonforge.runtime.doctor import listeners
from tritonforge.runtime.server import (
    RESTRICTED_API_KEY_ENV,
    RESTRICTED_GROUPS,
    RESTRICTED_HEADER,
    ServerOptions,
    TritonServer,
    find_install,
)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.mark.server
def test_session_server_listens_on_loopback_only(triton_server: Any) -> None:
    for url in (triton_server.http_url, triton_server.grpc_url, triton_server.metrics_url):
        found = listeners(_port(url))
        assert found, f"nothing listens on {url}"
        addresses = {addr for addr, _ in found}
        assert addresses <= {"127.0.0.1", "::1", "::ffff:127.0.0.1"}, (url, addresses)


# (method, path, body) of Triton's restricted HTTP APIs, one per group.
HTTP_ADMIN: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/v2/repository/index", {}),
    ("GET", "/v2/models/stats", None),
    ("GET", "/v2/trace/setting", None),
    ("GET", "/v2/logging", None),
    ("GET", "/v2/systemsharedmemory/status", None),
]


@pytest.mark.server
def test_http_admin_apis_need_the_key(triton_server: Any) -> None:
    key = triton_server.admin_key
    assert key, "the server under test must restrict its admin APIs (tritonforge serve's default)"
    base = f"http://{triton_server.http_url}"
    with httpx.Client(timeout=10) as http:
        for method, path, body in HTTP_ADMIN:
            refused = http.request(method, base + path, json=body)
            assert refused.status_code == 403, (path, refused.status_code, refused.text)
            assert "restricted" in refused.text, refused.text
            wrong = http.request(method, base + path, json=body, headers={RESTRICTED_HEADER: key + "x"})
            assert wrong.status_code == 403, (path, wrong.status_code)
            allowed = http.request(method, base + path, json=body, headers={RESTRICTED_HEADER: key})
            assert allowed.status_code == 200, (path, allowed.status_code, allowed.text)
        # Model control is in the repository group too: refused before it could unload anything.
        unload = http.post(f"{base}/v2/repository/models/{triton_server.model}/unload")
        assert unload.status_code == 403
        assert http.get(f"{base}/v2/health/ready").status_code == 200  # health stays open
        assert http.get(f"{base}/v2/models/{triton_server.model}/config").status_code == 200


@pytest.mark.server
def test_grpc_admin_apis_need_the_key(triton_server: Any) -> None:
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc

    key = triton_server.admin_key
    meta = ((f"triton-grpc-protocol-{RESTRICTED_HEADER}", key),)
    calls = [
        ("RepositoryIndex", pb.RepositoryIndexRequest()),
        ("ModelStatistics", pb.ModelStatisticsRequest(name=triton_server.model)),
        ("TraceSetting", pb.TraceSettingRequest()),
        ("LogSettings", pb.LogSettingsRequest()),
        ("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest()),
    ]
    with grpc.insecure_channel(triton_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for name, request in calls:
            fn = getattr(stub, name)
            with pytest.raises(grpc.RpcError) as refused:
                fn(request, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, (name, refused.value)
            assert "restricted" in str(refused.value.details()), refused.value.details()
            fn(request, timeout=10, metadata=meta)  # accepted with the key
        with pytest.raises(grpc.RpcError):
            stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=triton_server.model), timeout=10)
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready


def test_launcher_defaults_bind_loopback_and_restrict_admin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RESTRICTED_API_KEY_ENV, "k-from-env")
    server = TritonServer(ServerOptions(repository=Path("/nonexistent")), install=find_install())
    cmd = server.command()
    for flag in ("--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"):
        assert flag in cmd
    groups = ",".join(RESTRICTED_GROUPS)
    assert f"--http-restricted-api={groups}:{RESTRICTED_HEADER}=k-from-env" in cmd
    assert f"--grpc-restricted-protocol={groups}:{RESTRICTED_HEADER}=k-from-env" in cmd
    monkeypatch.delenv(RESTRICTED_API_KEY_ENV)
    generated = TritonServer(ServerOptions(repository=Path("/nonexistent")), install=find_install())
    assert generated.admin_key and len(generated.admin_key) >= 32  # random key when none is given
    opened = TritonServer(ServerOptions(repository=Path("/nonexistent"), restrict_admin=False),
                          install=find_install())
    assert not any("restricted" in a for a in opened.command())


def test_serve_cli_defaults_are_loopback_and_restricted() -> None:
    import inspect

    from tritonforge.cli.serve import serve

    params = inspect.signature(serve).parameters
    assert params["host"].default == "127.0.0.1"
    assert params["restrict_admin"].default is True
