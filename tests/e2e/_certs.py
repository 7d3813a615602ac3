"""Certificates made at test time: a CA, a server certificate for 127.0.0.1, client certificates.

Nothing here is a fixture file in the repository: every test run makes fresh keys (EC P-256,
fast to generate) with `cryptography`, and writes PEM files to the test's tmp_path, since the
server reads its TLS material from files like an operator would give it.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=2)


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, as PEM bytes and as files."""

    cert_pem: bytes
    key_pem: bytes
    cert_path: Path
    key_path: Path


@dataclass(frozen=True)
class Authority:
    """A self-signed CA that can issue server and client certificates."""

    name: str
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    folder: Path

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def path(self) -> Path:
        return self.folder / f"{self.name}-ca.pem"

    def issue_server(self, name: str = "server") -> Issued:
        """A server certificate for 127.0.0.1 and localhost."""
        names = x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        )
        return self._issue(name, names, ExtendedKeyUsageOID.SERVER_AUTH)

    def issue_client(self, name: str = "client") -> Issued:
        """A client certificate (for mTLS) whose common name is ``name``."""
        names = x509.SubjectAlternativeName([x509.DNSName(f"{name}.clients.test")])
        return self._issue(name, names, ExtendedKeyUsageOID.CLIENT_AUTH)

    def _issue(
        self, name: str, names: x509.SubjectAlternativeName, usage: x509.ObjectIdentifier
    ) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALID_FOR)
            .add_extension(names, critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return _write(self.folder, f"{self.name}-{name}", cert, key)


def authority(folder: Path, name: str = "test") -> Authority:
    """A fresh self-signed CA whose certificate is written to ``folder/NAME-ca.pem``."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"sessionlog test CA {name}")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALID_FOR)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    made = Authority(name, key, cert, folder)
    made.path.write_bytes(made.pem)
    return made


def _write(
    folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Issued:
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    cert_path, key_path = folder / f"{stem}.pem", folder / f"{stem}-key.pem"
    cert_path.write_bytes(cert_pem)
    key_path.write_bytes(key_pem)
    return Issued(cert_pem, key_pem, cert_path, key_path)
