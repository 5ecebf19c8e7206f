"""A self-signed certificate for the web UI's HTTPS (`shingle init --tls`).

With the ``cryptography`` package in the environment it is made in process;
otherwise by the ``openssl`` command. The key file is created 0600 before a
byte of the key is written (appliance.private)."""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
from pathlib import Path

from appliance.private import create_private, write_private

DAYS = 825  # the longest validity clients accept for a server certificate


def names_for(host: str) -> list[str]:
    """Subject alternative names: the configured host plus the loopback names."""
    names = ["localhost", "127.0.0.1", "::1"]
    if host and host not in ("0.0.0.0", "::") and host not in names:
        names.insert(0, host)
    return names


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def make_self_signed(cert_path: Path, key_path: Path, names: list[str]) -> str:
    """Write a new key and certificate for ``names``; returns the tool that made them."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return _with_openssl(cert_path, key_path, names)
    return _with_cryptography(cert_path, key_path, names)


def _with_cryptography(cert_path: Path, key_path: Path, names: list[str]) -> str:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    sans = [
        x509.IPAddress(ipaddress.ip_address(n)) if _is_ip(n) else x509.DNSName(n) for n in names
    ]
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=DAYS))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    write_private(
        key_path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode(),
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return "cryptography"


def _with_openssl(cert_path: Path, key_path: Path, names: list[str]) -> str:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("no TLS tool: install the cryptography package or the openssl command")
    san = ",".join(f"IP:{n}" if _is_ip(n) else f"DNS:{n}" for n in names)
    create_private(key_path)  # openssl then writes into the 0600 file it finds
    try:
        subprocess.run(
            [
                openssl,
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                str(key_path),
                "-out",
                str(cert_path),
                "-days",
                str(DAYS),
                "-subj",
                f"/CN={names[0]}",
                "-addext",
                f"subjectAltName={san}",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
    except subprocess.CalledProcessError as exc:
        key_path.unlink(missing_ok=True)
        raise RuntimeError(f"openssl could not make a certificate: {exc.stderr.strip()}") from None
    return "openssl"
