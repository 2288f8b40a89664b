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


@pytest.mark.server
def test_local_commands_learn_the_key_other_callers_do_not(
        triton_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The running server published its key for its own ports in a user-only file; a client
    on this machine with no key configured discovers the model through it; a caller from
    another address (127.0.0.2 here, a second loopback address: no traffic leaves the host)
    that does not hold the key is refused by Triton itself, and so is a wrong key."""
    import os
    import stat

    from tritonforge.clients import Client
    from tritonforge.runtime import adminkey

    monkeypatch.delenv(RESTRICTED_API_KEY_ENV, raising=False)
    key = triton_server.admin_key
    for url in (triton_server.http_url, triton_server.grpc_url):
        path = adminkey.key_file(_port(url))
        assert path.read_text() == key
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, oct(path.stat().st_mode)
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert path.stat().st_uid == os.getuid()
        assert adminkey.local_key(url) == key
        host_free = url.replace("127.0.0.1", "192.0.2.1")  # never contacted: a pure lookup
        assert adminkey.local_key(host_free) is None  # the file is only for loopback URLs
    for protocol, url in (("grpc", triton_server.grpc_url), ("http", triton_server.http_url)):
        with Client(url, protocol=protocol) as client:  # type: ignore[arg-type]
            assert client.model is None
            assert client.complete("Hi", max_tokens=2).completion_tokens > 0
            assert client.model == triton_server.model

    base = f"http://{triton_server.http_url}"
    with httpx.Client(timeout=10, transport=httpx.HTTPTransport(local_address="127.0.0.2")) as other:
        refused = other.post(base + "/v2/repository/index", json={})
        assert refused.status_code in (401, 403), (refused.status_code, refused.text)
        wrong = other.post(base + "/v2/repository/index", json={}, headers={RESTRICTED_HEADER: "nope"})
        assert wrong.status_code in (401, 403), wrong.status_code
        assert other.post(base + "/v2/repository/index", json={},
                          headers={RESTRICTED_HEADER: key}).status_code == 200
        assert other.get(base + "/v2/health/ready").status_code == 200  # inference stays open


def test_a_stopped_server_withdraws_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tritonforge.runtime import adminkey

    monkeypatch.setenv("TRITONFORGE_CACHE", str(tmp_path))
    monkeypatch.delenv(RESTRICTED_API_KEY_ENV, raising=False)
    written = adminkey.publish("k1", (40001, 40002))
    assert adminkey.local_key("127.0.0.1:40001") == "k1"
    assert adminkey.local_key("http://localhost:40002") == "k1"
    os_chmod = written[0].chmod
    os_chmod(0o644)  # readable by others: not trusted
    assert adminkey.local_key("127.0.0.1:40001") is None
    adminkey.publish("k2", (40002,))  # another server took the port since
    adminkey.withdraw("k1", written)
    assert not written[0].exists()
    assert adminkey.local_key("127.0.0.1:40002") == "k2"  # not removed: not ours any more
