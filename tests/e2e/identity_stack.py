"""A stack for the identity tests (tests/e2e/test_identity.py): the e2e policy with one route's
identity set, and Envoy's config generated from it by ``ice envoy-config``'s local flavour
(``local_bootstrap``: jwt_authn, the listener's TLS), as an operator gets it. Credentials are
made here: an RSA key and its JWKS for the JWTs, a CA with a server certificate and client
certificates carrying SPIFFE IDs."""

from __future__ import annotations

import contextlib
import datetime
import http.client
import json
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from ext_proc.lab.stack import Stack, free_port, render_envoy_config
from ext_proc.tools.envoygen.emit import to_yaml
from ext_proc.tools.envoygen.local import local_bootstrap
from ext_proc.tools.envoygen.spec import load_spec

from .harness import CHAT, E2E, PROBE, PROBE_HEADERS, Reply, write_policy

ISSUER = "https://issuer.ice.test"
AUDIENCE = "ice-gateway"
KID = "test-key"
MESSAGES = "/v1/messages"
QUEUE = "    queue: {enabled: true, tenant_header: x-tenant}\n"
MESSAGES_LINE = "  messages: {profile: default, pool: default}\n"


# --- JWTs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Signer:
    """An RSA key and its JWKS (the operator's identity provider)."""

    key: rsa.RSAPrivateKey

    @staticmethod
    def new() -> Signer:
        return Signer(rsa.generate_private_key(public_exponent=65537, key_size=2048))

    def jwks(self) -> str:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return json.dumps({"keys": [{**jwk, "kid": KID, "alg": "RS256", "use": "sig"}]})

    def token(self, sub: str, **claims: Any) -> str:
        now = int(time.time())
        payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + 600}
        payload.update(claims)
        return jwt.encode(payload, self.key, algorithm="RS256", headers={"kid": KID})


# --- certificates ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(
    folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Issued:
    cert_path, key_path = folder / f"{stem}.pem", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Issued(cert_path, key_path)


@dataclass(frozen=True)
class Ca:
    """A test CA that issues the server's and the clients' certificates."""

    folder: Path
    name: str
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @staticmethod
    def new(folder: Path, name: str = "ice-test-ca") -> Ca:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        folder.mkdir(parents=True, exist_ok=True)
        _write(folder, name, cert, key)
        return Ca(folder, name, key, cert)

    @property
    def pem(self) -> Path:
        return self.folder / f"{self.name}.pem"

    def issue(self, stem: str, sans: list[x509.GeneralName], *, server: bool = False) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = (
            x509.oid.ExtendedKeyUsageOID.SERVER_AUTH
            if server
            else (x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH)
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(stem))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return _write(self.folder, stem, cert, key)


# --- the stack ---------------------------------------------------------------------------------


def tls_request(
    port: int,
    ca: Path,
    client: Issued | None,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
) -> Reply:
    """One HTTPS request to 127.0.0.1:``port`` presenting ``client``'s certificate (None: no
    certificate)."""
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    try:
        sent = {"content-type": "application/json", **headers}
        conn.request("POST", path, body=json.dumps(body).encode(), headers=sent)
        resp = conn.getresponse()
        return Reply(resp.status, [(k.lower(), v) for k, v in resp.getheaders()], resp.read())
    finally:
        conn.close()


@contextlib.contextmanager
def identity_stack(
    workdir: Path,
    identity: str,
    *,
    tls: dict[str, str] | None = None,
    probe: Issued | None = None,
    edit: Callable[[dict[str, Any]], None] | None = None,
) -> Iterator[E2E]:
    """Backend, ICE and the generated Envoy; the ``messages`` route's identity is
    ``identity`` (flow YAML), the others trust as before; the profile's fair queue names
    tenants by ``x-tenant`` (``QUEUE``). ``tls``: the spec's ``tls`` (the
    listener then requires client certificates: ``probe`` is the one the readiness probe
    presents). ``edit``: changes the generated bootstrap first (what an operator adds)."""
    with Stack(workdir) as stack:
        backend_port = free_port()
        stack.start_backend(backend_port)
        policy = write_policy(workdir / "policy.yaml", backend_port, QUEUE)
        text = policy.read_text()
        assert MESSAGES_LINE in text
        bound = f"  messages: {{profile: default, pool: default, identity: {identity}}}\n"
        policy.write_text(text.replace(MESSAGES_LINE, bound))
        spec_doc: dict[str, Any] = {
            "policy": str(policy),
            "gateway": {"hosts": ["*"]},
            "routes": [
                {"name": "chat", "path": CHAT},
                {"name": "messages", "path": MESSAGES},
            ],
        }
        if tls is not None:
            spec_doc["tls"] = tls
        spec_path = workdir / "mesh.yaml"
        spec_path.write_text(yaml.safe_dump(spec_doc))
        template = workdir / "envoy-identity.yaml"
        bootstrap = local_bootstrap(load_spec(spec_path))
        if edit is not None:
            edit(bootstrap)
        template.write_text(to_yaml([bootstrap], ""))
        address = f"127.0.0.1:{free_port()}"
        metrics_port = free_port()
        stack.start_ice(address, policy=policy, metrics_address=f"127.0.0.1:{metrics_port}")
        envoy_port, admin_port = free_port(), free_port()
        config = render_envoy_config(
            template,
            admin_port=admin_port,
            listeners={"ingress": envoy_port},
            clusters={"ice": [address], "backend": [f"127.0.0.1:{backend_port}"]},
        )
        stack.start_envoy(config, admin_port)
        e2e = E2E(
            stack=stack,
            workdir=workdir,
            envoy_port=envoy_port,
            admin_port=admin_port,
            backend_port=backend_port,
            ice_addresses=[address],
            ice_metrics_port=metrics_port,
        )
        deadline = time.monotonic() + 20
        while True:  # ICE judges (its pressure header) once it has scraped the backend
            try:
                if tls is not None:
                    ca = workdir / "tls" / "ice-test-ca.pem"
                    reply = tls_request(envoy_port, ca, probe, CHAT, PROBE, PROBE_HEADERS)
                else:
                    reply = e2e.post(CHAT, PROBE, PROBE_HEADERS)
                if reply.header("x-mem-pressure") == "low":
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"the stack did not start\n{e2e.log_tails()}"
            time.sleep(0.1)
        time.sleep(0.25)
        e2e.clear_received()
        yield e2e
