"""The client side: client config files (every error names the problem), QuorumClient and the
CLI over real TLS with certificates and tokens, and the quick UNAVAILABLE when nothing listens."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from quorum.client import QuorumClient
from quorum.localports import free_ports
from quorum.runtime.middleware import PRINCIPAL_KEY, auth_middleware
from quorum.security.clientconfig import ENV_VAR, load_client_config, parse_client_config, resolve
from quorum.security.tlsctx import server_context
from quorum.types import ErrorCode, KraftError
from tests.security.conftest import CLUSTER, Pki


def _write(d: Path, obj: object, name: str = "client.json") -> Path:
    p = d / name
    p.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
    return p


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("[]", "JSON object"),
        ("{", "not valid JSON"),
        ({"ca_file": "ca.crt", "token_file": "t", "cafile": "x"}, "'cafile'"),
        ({"ca_file": "ca.crt"}, "cert_file"),
        ({"cert_file": "a.crt", "token_file": "t"}, "key_file"),
        ({"token_file": 5}, "token_file must be"),
        ({"token_file": ""}, "token_file must be"),
        ({"token_file": "t", "ca_file": {"x": 1}}, "ca_file must be"),
        ({"token_file": None}, "token_file must be a non-empty file path string, got None"),
        ({"cert_file": "c", "key_file": "k\u0000"}, "key_file must be"),
        ({"token_file": "t", "cafile": 1, "bearer": "x"}, "unknown key(s) 'bearer', 'cafile' (allowed:"),
        ({}, "needs cert_file (with key_file) or token_file"),
    ],
)
def test_config_errors_name_the_problem(tmp_path: Path, content: object, words: str) -> None:
    p = _write(tmp_path, content)
    with pytest.raises(KraftError) as e:
        load_client_config(p)
    assert e.value.code is ErrorCode.INVALID_REQUEST
    assert str(p) in e.value.message and words in e.value.message


def test_the_model_has_the_documented_keys() -> None:
    from quorum.security.clientconfig import KEYS
    from quorum.security.clientmodel import ClientConfigDoc

    assert tuple(ClientConfigDoc.model_fields) == KEYS


def test_config_paths_are_relative_to_its_folder(pki: Pki, tmp_path: Path) -> None:
    p = _write(
        pki.dir, {"ca_file": "ca.crt", "cert_file": "read.crt", "key_file": "read.key"}, "read-client.json"
    )
    cfg = load_client_config(p)
    assert cfg.ca_file == pki.dir / "ca.crt" and cfg.key_file == pki.dir / "read.key"
    assert cfg.scheme == "https" and cfg.ssl_context() is not None and cfg.headers() == {}
    missing = _write(tmp_path, {"ca_file": "ca.crt", "token_file": "t.token"})
    with pytest.raises(KraftError, match=r"ca_file .*ca.crt does not exist"):
        load_client_config(missing)
    (tmp_path / "ca.crt").write_text("not a certificate")
    (tmp_path / "t.token").write_text("has spaces in it and is wrong\n")
    cfg = load_client_config(missing)
    with pytest.raises(KraftError, match="does not hold a bearer token"):
        cfg.headers()
    with pytest.raises(KraftError, match="cannot load"):
        cfg.ssl_context()


def test_env_variable_is_the_default(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _write(pki.dir, {"ca_file": "ca.crt", "token_file": "tok.token"}, "env.json")
    (pki.dir / "tok.token").write_text(pki.token["read"] + "\n")
    monkeypatch.setenv(ENV_VAR, str(p))
    cfg = resolve(None)
    assert cfg is not None and cfg.headers() == {"Authorization": f"Bearer {pki.token['read']}"}
    monkeypatch.delenv(ENV_VAR)
    assert resolve(None) is None
    no_ca = parse_client_config(b'{"token_file": "/abs/t"}', "x", "/base")
    assert no_ca.token_file == Path("/abs/t")
    # a token is never sent in clear: without ca_file the client still speaks https, verifying
    # nodes against the system trust store
    assert no_ca.scheme == "https" and no_ca.ssl_context().verify_mode == ssl.CERT_REQUIRED


@pytest.fixture
async def tls_app(pki: Pki) -> AsyncIterator[tuple[str, list[str]]]:
    calls: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        p = request[PRINCIPAL_KEY]
        calls.append(f"{request.method} {request.path} {p.name}")
        if request.method == "PUT":
            return web.json_response({"offset": 7})
        if request.path == "/v1/quorum/describe":
            return web.json_response({"cluster_id": CLUSTER, "leader_id": 1, "voters": []})
        return web.Response(body=b"value")

    app = web.Application(middlewares=[auth_middleware(CLUSTER, pki.tokens)])
    app.router.add_route("*", "/v1/kv/{key}", handler)
    app.router.add_get("/v1/quorum/describe", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context(pki.dir / "ca.crt", *pki.node(1)))
    await site.start()
    try:
        yield f"127.0.0.1:{runner.addresses[0][1]}", calls
    finally:
        await runner.cleanup()


async def test_quorum_client_over_tls_with_cert_and_token(pki: Pki, tls_app: tuple[str, list[str]]) -> None:
    ep, calls = tls_app
    cert_cfg = load_client_config(
        _write(
            pki.dir,
            {"ca_file": "ca.crt", "cert_file": "readwrite.crt", "key_file": "readwrite.key"},
            "rw.json",
        )
    )
    async with QuorumClient(ep, timeout=10, client_config=cert_cfg) as c:
        assert await c.put("k", b"v") == 7
        assert await c.get("k") == b"value"
        with pytest.raises(KraftError) as e:
            await c.describe()
        assert e.value.code is ErrorCode.PERMISSION_DENIED
    (pki.dir / "adm.token").write_text(pki.token["admin"])
    tok_cfg = load_client_config(
        _write(pki.dir, {"ca_file": "ca.crt", "token_file": "adm.token"}, "adm.json")
    )
    async with QuorumClient(ep, timeout=10, client_config=tok_cfg) as c:
        assert (await c.describe())["cluster_id"] == CLUSTER
    # an invalid token: 401, final at once (not retried until the timeout)
    (pki.dir / "bad.token").write_text("kk_" + "A" * 40)
    none_cfg = load_client_config(
        _write(pki.dir, {"ca_file": "ca.crt", "token_file": "bad.token"}, "bad.json")
    )
    async with QuorumClient(ep, timeout=60, client_config=none_cfg) as c:
        with pytest.raises(KraftError) as e:
            await c.get("k")
        assert e.value.code is ErrorCode.UNAUTHENTICATED
    assert calls == ["PUT /v1/kv/k readwrite", "GET /v1/kv/k readwrite", "GET /v1/quorum/describe tok-admin"]


@pytest.mark.slow  # starts processes
async def test_cli_uses_the_client_config(pki: Pki, tls_app: tuple[str, list[str]]) -> None:
    ep, calls = tls_app
    cfg = _write(pki.dir, {"ca_file": "ca.crt", "cert_file": "read.crt", "key_file": "read.key"}, "cli.json")
    env = dict(os.environ, **{ENV_VAR: str(cfg)})
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "quorum.cli",
        "kv",
        "get",
        "--bootstrap",
        ep,
        "k",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err
    assert out == b"value\n"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "quorum.cli",
        "kv",
        "put",
        "--bootstrap",
        ep,
        "--client-config",
        str(cfg),
        "k",
        "v",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 1 and err.startswith(b"PERMISSION_DENIED: ")
    assert calls == ["GET /v1/kv/k read"]


@pytest.mark.slow  # starts processes
def test_describe_where_nothing_listens_is_unavailable_at_once(tmp_path: Path) -> None:
    ports = free_ports(2)  # ports that were just free: nothing listens on them
    boot = ",".join(f"127.0.0.1:{p}" for p in ports)
    # --timeout 120: without the quick refusal this would retry for two minutes and then say
    # "cannot reach"; the message proves which path ended it
    r = subprocess.run(
        [sys.executable, "-m", "quorum.cli", "quorum", "describe", "--bootstrap", boot, "--timeout", "120"],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert r.returncode == 1
    assert r.stderr.startswith("UNAVAILABLE: connection refused by every address"), r.stderr


async def test_https_to_a_plaintext_node_fails_at_once(pki: Pki) -> None:
    async def plain(request: web.Request) -> web.Response:
        return web.Response(body=b"x")

    app = web.Application()
    app.router.add_get("/v1/kv/{key}", plain)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        ep = f"127.0.0.1:{runner.addresses[0][1]}"
        cfg = load_client_config(
            _write(pki.dir, {"ca_file": "ca.crt", "cert_file": "read.crt", "key_file": "read.key"}, "p.json")
        )
        # timeout 120: a retry loop would end with "cannot reach" much later; the message shows
        # the handshake failure ended it
        async with QuorumClient(ep, timeout=120, client_config=cfg) as c:
            with pytest.raises(KraftError) as e:
                await c.get("k")
        assert e.value.code is ErrorCode.UNAVAILABLE and "TLS handshake" in e.value.message
    finally:
        await runner.cleanup()
