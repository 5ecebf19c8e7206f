"""The cluster's own CA and the certificates etcd's members, Patroni and the heads present to
each other (`shingle cluster plan`, `add-host`; docs/cluster.md "TLS for etcd").

Made by the ``openssl`` command (scripts/bootstrap.sh installs it; the cryptography package is
not a dependency), EC P-256 keys, each key file created 0600 before openssl writes into it
(appliance.private). One folder holds everything, beside the plan:

    ca.crt  ca.key          the cluster CA (the key signs new hosts' certificates: keep it on the
                            host that made the plan)
    NAME.crt  NAME.key      a member host (common name NAME): subject alternative names its
                            address and 127.0.0.1, IP addresses only; server and client use
                            (etcd peers check the client's address against them, and etcd's
                            JSON gateway dials its own gRPC server with the member's
                            certificate)

No DNS names: everything in a plan is addressed by IP, and a DNS name in a server's
certificate makes Patroni's etcd client (python-etcd, which puts pyOpenSSL into urllib3 when
python3-openssl is installed) import the idna module, which Debian installs only as a
suggestion: Patroni then never reaches etcd ("No module named 'idna'", seen on the test bed).
    client.crt  client.key  what heads, Patroni's admin commands and this CLI present to etcd

The doctor reads certificates back in process (``inspect``, ``ca_facts``): no openssl run."""

from __future__ import annotations

import datetime
import ipaddress
import secrets
import shutil
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from appliance.private import create_private

CA_DAYS = 3650
CERT_DAYS = 825  # the longest validity clients accept for a server certificate
CLIENT = "client"


class TlsError(RuntimeError):
    """openssl is absent or refused: one line saying which and why."""


def _openssl(*args: str) -> str:
    tool = shutil.which("openssl")
    if tool is None:
        raise TlsError("the cluster's certificates need the openssl command (apt install openssl)")
    done = subprocess.run([tool, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise TlsError(f"openssl {args[0]}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def make_ca(folder: Path, name: str, days: int = CA_DAYS) -> None:
    """``folder``/ca.crt and ca.key: a new CA named after the cluster."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    key, cert = folder / "ca.key", folder / "ca.crt"
    create_private(key)
    with tempfile.NamedTemporaryFile("w", suffix=".cnf") as ext:
        ext.write(
            "[req]\ndistinguished_name = dn\n[dn]\n[ca]\n"
            "basicConstraints = critical,CA:TRUE,pathlen:0\n"
            "keyUsage = critical,keyCertSign,cRLSign\nsubjectKeyIdentifier = hash\n"
        )
        ext.flush()
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-nodes", "-keyout", str(key), "-out", str(cert), "-days", str(days),
                 "-subj", f"/CN={name} cluster CA", "-config", ext.name,
                 "-extensions", "ca")  # fmt: skip


def subject_names(addresses: list[str]) -> list[str]:
    """A host's names: its addresses and loopback (etcdctl on the member itself)."""
    return list(dict.fromkeys([*addresses, "127.0.0.1"]))


def make_cert(folder: Path, name: str, addresses: list[str], days: int = CERT_DAYS) -> None:
    """``folder``/NAME.crt and NAME.key signed by the folder's CA, for ``addresses``."""
    key, cert = folder / f"{name}.key", folder / f"{name}.crt"
    for address in addresses:
        ipaddress.ip_address(address)  # ValueError: not an address
    san = ",".join(f"IP:{n}" for n in subject_names(addresses))
    create_private(key)
    try:
        # one command: a new key, and its certificate signed by the CA at once (OpenSSL 3)
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-nodes", "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}",
                 "-CA", str(folder / "ca.crt"), "-CAkey", str(folder / "ca.key"),
                 "-set_serial", "0x" + secrets.token_hex(16), "-days", str(days),
                 "-addext", f"subjectAltName = {san}",
                 "-addext", "extendedKeyUsage = serverAuth,clientAuth",
                 "-addext", "keyUsage = critical,digitalSignature,keyEncipherment",
                 "-addext", "basicConstraints = critical,CA:FALSE")  # fmt: skip
    except TlsError:
        key.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class CertFacts:
    subject: str
    not_before: datetime.datetime
    not_after: datetime.datetime
    names: frozenset[str]  # the subject alternative names (IP addresses and DNS names)


def _when(text: str) -> datetime.datetime:
    # openssl's dates: "Dec  7 11:51:03 2026 GMT"
    return datetime.datetime.strptime(" ".join(text.split()), "%b %d %H:%M:%S %Y %Z").replace(
        tzinfo=datetime.UTC
    )


def _facts(decoded: dict) -> CertFacts:
    """From the dict Python's ssl module gives for a certificate (getpeercert, get_ca_certs)."""
    subject = ",".join(f"{k}={v}" for rdn in decoded.get("subject", ()) for k, v in rdn)
    return CertFacts(
        subject.replace("commonName=", "CN="),
        _when(decoded["notBefore"]),
        _when(decoded["notAfter"]),
        frozenset(value for _kind, value in decoded.get("subjectAltName", ())),
    )


def ca_facts(ca: Path) -> CertFacts:
    """The CA's certificate as a client loads it (OSError, ssl.SSLError when it cannot)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(ca)
    found = context.get_ca_certs()
    if not found:
        raise ssl.SSLError(f"{ca}: no CA certificate in it")
    return _facts(found[0])


def inspect(ca: Path, cert: Path, key: Path) -> tuple[CertFacts | None, str | None]:
    """``cert`` with its ``key`` as a server would present them, checked by a client trusting
    only ``ca``: a TLS handshake in memory, no socket and no openssl process. (its facts,
    None) when it chains to the CA, is within its dates and ``key`` is its own; else (None,
    why not)."""
    try:
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(cert, key)
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname = False  # names are compared by the caller, per host
        client.load_verify_locations(ca)
    except ssl.SSLError as exc:
        return None, f"{key} is not the key of {cert} ({exc.reason})"
    except OSError as exc:
        return None, f"{exc.filename or cert}: {exc.strerror}"
    wires = [ssl.MemoryBIO() for _ in range(4)]
    near = client.wrap_bio(wires[0], wires[1])
    far = server.wrap_bio(wires[2], wires[3], server_side=True)
    done = [False, False]
    for _ in range(10):  # a TLS 1.3 handshake takes two round trips
        for index, end in enumerate((near, far)):
            if not done[index]:
                try:
                    end.do_handshake()
                    done[index] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLCertVerificationError as exc:
                    return None, exc.verify_message
                except ssl.SSLError as exc:
                    return None, str(exc.reason)
        wires[2].write(wires[1].read())
        wires[0].write(wires[3].read())
        if all(done):
            break
    peer = near.getpeercert()
    if not peer:
        return None, "no handshake"
    return _facts(peer), None
