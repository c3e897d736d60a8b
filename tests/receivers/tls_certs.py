"""Real X.509 material for the TLS tests: a CA, a server certificate for 127.0.0.1 /
localhost, a client certificate of that CA and one of an unrelated CA (for rejection)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Certs", "make_certs"]


@dataclass(frozen=True)
class Certs:
    ca: Path  # CA certificate (trust anchor for the server and for client certificates)
    server_cert: Path
    server_key: Path
    client_cert: Path  # signed by ``ca``
    client_key: Path
    rogue_cert: Path  # signed by an unrelated CA
    rogue_key: Path
    other_key: Path  # a key that matches no certificate here


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    issuer_name = issuer[0].subject if issuer else _name(subject)
    signer = issuer[1] if issuer else key
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        b = b.add_extension(
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
        b = b.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        assert issuer is not None
        b = b.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer[1].public_key()), False
        )
    if server:
        b = b.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return b.sign(signer, hashes.SHA256())


def _write(
    path: Path, cert: x509.Certificate | None, key: ec.EllipticCurvePrivateKey | None
) -> Path:
    if cert is not None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    else:
        assert key is not None
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return path


def make_certs(d: Path) -> Certs:
    """Write the material under ``d``."""
    ca_key, rogue_ca_key = _key(), _key()
    ca = _cert("coeffd test CA", ca_key, None, ca=True)
    rogue_ca = _cert("rogue CA", rogue_ca_key, None, ca=True)
    server_key, client_key, rogue_key = _key(), _key(), _key()
    server = _cert("coeffd", server_key, (ca, ca_key), server=True)
    client = _cert("vllm-engine", client_key, (ca, ca_key))
    rogue = _cert("vllm-engine", rogue_key, (rogue_ca, rogue_ca_key))
    return Certs(
        ca=_write(d / "ca.crt", ca, None),
        server_cert=_write(d / "tls.crt", server, None),
        server_key=_write(d / "tls.key", None, server_key),
        client_cert=_write(d / "client.crt", client, None),
        client_key=_write(d / "client.key", None, client_key),
        rogue_cert=_write(d / "rogue.crt", rogue, None),
        rogue_key=_write(d / "rogue.key", None, rogue_key),
        other_key=_write(d / "other.key", None, _key()),
    )
