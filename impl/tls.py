"""Mutual TLS between the servers and for clients of the router, and the identities that the
certificates carry.

A caller's identity comes from its client certificate, never from a request field. A kvhandoff
certificate names its holder in subject-alternative-name URIs:

* ``kvhandoff:role=ROLE`` with ROLE one of router, prefill, decode (the servers, which also call
  each other) or client (a caller of the router's API);
* ``kvhandoff:tenant=TENANT`` on a client certificate: the one tenant it may act for.

`Pki` is a CA in a directory that issues such certificates; `kvhandoff serve all` makes a
throwaway one. `identity_of_pem` reads the identity back on the server side.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from kvhandoff.impl.errors import ConfigError

ROLES = ("router", "prefill", "decode", "client")
_URI_PREFIX = "kvhandoff:"


@dataclass(frozen=True)
class Identity:
    role: str
    tenant: str | None = None

    def __str__(self) -> str:
        return self.role if self.tenant is None else f"{self.role} of tenant {self.tenant!r}"


@functools.lru_cache(maxsize=1024)
def identity_of_pem(pem: bytes) -> Identity | None:
    """The kvhandoff identity a certificate carries, or None when it names no role (one role
    and at most one tenant; a certificate with two of either names no identity)."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    roles, tenants = [], []
    for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
        if not uri.startswith(_URI_PREFIX):
            continue
        key, _, value = uri[len(_URI_PREFIX) :].partition("=")
        if key == "role":
            roles.append(value)
        elif key == "tenant":
            tenants.append(value)
    if len(roles) != 1 or roles[0] not in ROLES or len(tenants) > 1:
        return None
    return Identity(roles[0], tenants[0] if tenants else None)


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    ca: Path

    def _read(self) -> tuple[bytes, bytes, bytes]:
        try:
            return self.cert.read_bytes(), self.key.read_bytes(), self.ca.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read TLS file: {exc}") from exc

    def server_credentials(self) -> grpc.ServerCredentials:
        cert, key, ca = self._read()
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        cert, key, ca = self._read()
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )


class Pki:
    """A certificate authority kept in ``directory`` (ca.crt, ca.key) that issues certificates
    for 127.0.0.1/localhost carrying a kvhandoff identity. For loopback deployments, tests and
    demos: whoever can read ca.key can mint any identity."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = directory / "ca.crt"
        self._ca_key = directory / "ca.key"

    @classmethod
    def open(cls, directory: Path) -> Pki:
        """The CA in ``directory``, created there (valid for 30 days) when there is none."""
        pki = cls(directory)
        if pki.ca.is_file() and pki._ca_key.is_file():
            return pki
        if pki.ca.exists() or pki._ca_key.exists():
            raise ConfigError(f"{directory} holds only one of ca.crt and ca.key")

        directory.mkdir(parents=True, exist_ok=True)
        cert, key = _self_signed_ca("kvhandoff throwaway CA", days=30)
        _write_pem(pki.ca, cert, None)
        _write_pem(pki._ca_key, None, key)
        return pki

    def issue(self, role: str, tenant: str | None = None) -> TlsFiles:
        """Key and certificate for ``role`` (and ``tenant``, for a client), written next to the
        CA as ``ROLE[-TENANT].crt/.key``; issued again when asked again."""
        if role not in ROLES:
            raise ConfigError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
        if (role == "client") != (tenant is not None):
            raise ConfigError("a client certificate names one tenant; a server's names none")
        if tenant is not None and not (0 < len(tenant) <= 128 and tenant.isprintable()):
            raise ConfigError(f"tenant {tenant!r} must be 1..128 printable characters")
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        try:
            ca_cert = x509.load_pem_x509_certificate(self.ca.read_bytes())
            ca_key: Any = serialization.load_pem_private_key(
                self._ca_key.read_bytes(), password=None
            )
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the CA in {self.directory}: {exc}") from exc
        uris = [f"{_URI_PREFIX}role={role}"]
        if tenant is not None:
            uris.append(f"{_URI_PREFIX}tenant={tenant}")
        stem = role if tenant is None else f"{role}-{_file_safe(tenant)}"
        files = TlsFiles(self.directory / f"{stem}.crt", self.directory / f"{stem}.key", self.ca)
        _issue(ca_cert, ca_key, files, stem, uris)
        return files


def _file_safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else f"%{ord(c):02x}" for c in text)


def _write_pem(path: Path, cert: Any, key: Any) -> None:
    from cryptography.hazmat.primitives import serialization

    if cert is not None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    else:
        path.touch(mode=0o600)
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )


def _issue(ca_cert: Any, ca_key: Any, files: TlsFiles, cn: str, uris: list[str]) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn[:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    *(x509.UniformResourceIdentifier(u) for u in uris),
                ]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_pem(files.cert, cert, None)
    _write_pem(files.key, None, key)


def _self_signed_ca(common_name: str, days: int) -> tuple[Any, Any]:
    """A new CA: its self-signed certificate and its private key (P-256), valid from five
    minutes ago (clock skew between test processes) for `days` days."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def make_test_pki(directory: Path, name: str = "kvhandoff") -> TlsFiles:
    """A throw-away CA and one certificate for 127.0.0.1/localhost usable as server and client.
    For tests and demos only."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_cert, ca_key = _self_signed_ca(f"{name} test CA", days=1)
    ca_name = ca_cert.subject
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(directory / f"{name}.crt", directory / f"{name}.key", directory / "ca.crt")
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return files
