"""TLS to the servers and a path prefix in a server URL, against a local https server with a
certificate made here (its own CA): every request the router makes (health checks, the relay,
the model list) goes through the same TLS settings and keeps the prefix."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from routerkit import HERE, router, wait_for
from utils import free_port, running

PREFIX = "/sglang/v0"
MESSAGES: Any = [{"role": "user", "content": "hi"}]


def make_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (it is its own CA): (cert.pem, key.pem)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dynspec test server")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(https URL with the prefix, the CA file that verifies it)."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = make_certificate(folder)
    port = free_port()
    argv = [sys.executable, str(HERE / "tls_upstream.py"), str(port), str(cert), str(key), PREFIX]
    with running(argv, log=folder / "server.log"):
        base = f"https://127.0.0.1:{port}"
        assert wait_for(lambda: _up(base + PREFIX + "/health", cert), timeout=30)
        yield base + PREFIX, cert


def _up(url: str, cert: Path) -> bool:
    try:
        return (
            httpx.get(
                url, verify=ssl.create_default_context(cafile=str(cert)), timeout=2
            ).status_code
            == 200
        )
    except httpx.HTTPError:
        return False


def paths_seen(url: str, cert: Path) -> list[str]:
    return httpx.get(
        url + "/fake/paths", verify=ssl.create_default_context(cafile=str(cert)), timeout=5
    ).json()  # type: ignore[no-any-return]


async def test_https_server_with_private_ca_and_prefix(
    tls_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, cert = tls_server
    with router(tmp_path, "--eagle-url", url, "--upstream-ca", str(cert)) as rp:
        assert rp.status()["servers"][0]["healthy"] is True
        async with openai.AsyncOpenAI(base_url=rp.url + "/v1", api_key="x", max_retries=0) as c:
            reply = await c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=3)
            assert reply.choices[0].message.content == "t0 t1 t2 "
            stream = await c.chat.completions.create(
                model="m", messages=MESSAGES, max_tokens=4, stream=True
            )
            text = "".join([ch.choices[0].delta.content or "" async for ch in stream])
            assert text == "t0 t1 t2 t3 "
            assert [m.id for m in (await c.models.list()).data] == ["fake"]
    seen = set(paths_seen(url, cert))
    # Health checks, completions and the model list all kept the prefix; nothing went without.
    assert {PREFIX + "/health", PREFIX + "/v1/chat/completions", PREFIX + "/v1/models"} <= seen
    assert all(p.startswith(PREFIX + "/") for p in seen), seen


def test_certificate_verified_by_default(tls_server: tuple[str, Path], tmp_path: Path) -> None:
    """Without --upstream-ca the self-signed certificate is not trusted: the server is down."""
    url, _ = tls_server
    with router(tmp_path, "--eagle-url", url, ready="/metrics") as rp:
        assert wait_for(lambda: "CERTIFICATE_VERIFY_FAILED" in rp.log.read_text(), timeout=10)
        assert httpx.get(rp.url + "/health", timeout=5).status_code == 503
        r = httpx.post(rp.url + "/v1/chat/completions", json={"messages": MESSAGES}, timeout=5)
        assert r.status_code == 503


@pytest.mark.parametrize("content", [None, b"not a certificate\n"], ids=["missing", "not-pem"])
def test_bad_ca_file_is_one_line_exit_2(tmp_path: Path, content: bytes | None) -> None:
    ca = tmp_path / "ca.pem"
    if content is not None:
        ca.write_bytes(content)
    argv = [sys.executable, "-m", "dynspec.router", "--eagle-url", "https://127.0.0.1:1",
            "--upstream-ca", str(ca)]  # fmt: skip
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--upstream-ca" in lines[0], done.stderr
