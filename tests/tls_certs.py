"""Certificates made at test time (the ``cryptography`` library): a CA, server certificates for
127.0.0.1 and localhost (good, expired, for another host), client certificates from that CA and
from another one. EC P-256 keys: quick to make."""

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_NOW = dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path
    serial: int


@dataclass(frozen=True)
class Certs:
    ca: Path  # the CA's certificate (clients trust it; the server checks client certs with it)
    server: Pair  # for 127.0.0.1 and localhost
    server_renewed: Pair  # the same names, another serial (certificate rotation)
    expired: Pair
    wrong_host: Pair  # for other.example only
    client: Pair  # signed by the CA
    stranger: Pair  # a client certificate from another CA
    other_ca: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pair:
    cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    return Pair(cert_path, key_path, cert.serial_number)


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_NOW - dt.timedelta(days=1))
        .not_valid_after(_NOW + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    cn: str,
    *,
    hosts: list[str] | None = None,
    client: bool = False,
    expired: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _NOW - dt.timedelta(days=1), _NOW + dt.timedelta(days=30)
    if expired:
        start, end = _NOW - dt.timedelta(days=30), _NOW - dt.timedelta(days=1)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if hosts:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_certs(folder: Path) -> Certs:
    folder.mkdir(parents=True, exist_ok=True)
    ca = _ca("lumenrt test CA")
    other = _ca("another CA")
    local = ["127.0.0.1", "localhost"]
    ca_path, other_path = folder / "ca.crt", folder / "other-ca.crt"
    ca_path.write_bytes(ca[0].public_bytes(serialization.Encoding.PEM))
    other_path.write_bytes(other[0].public_bytes(serialization.Encoding.PEM))
    return Certs(
        ca=ca_path,
        server=_write(folder, "server", *_leaf(ca, "127.0.0.1", hosts=local)),
        server_renewed=_write(folder, "server-renewed", *_leaf(ca, "127.0.0.1", hosts=local)),
        expired=_write(folder, "expired", *_leaf(ca, "127.0.0.1", hosts=local, expired=True)),
        wrong_host=_write(folder, "wrong-host", *_leaf(ca, "other.example", hosts=["other.example"])),
        client=_write(folder, "client", *_leaf(ca, "client", client=True)),
        stranger=_write(folder, "stranger", *_leaf(other, "stranger", client=True)),
        other_ca=other_path,
    )
