"""A throw-away MIT Kerberos KDC (Debian krb5-kdc) for tests: its own realm, database, keytabs
and krb5.conf in a temp folder, listening on 127.0.0.1, a child of the test run.

The process's KRB5_CONFIG points at the KDC's krb5.conf while it runs (the GSS-API reads it for
every new context), so the in-process GSS initiators of the tests find it; ``stop`` puts the
old value back."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

KDC_BIN = Path("/usr/sbin/krb5kdc")
REALM = "SHINGLE.TEST"
SERVER_HOST = "shingle-test"  # the service principal is nfs/SERVER_HOST@REALM


def free_udp_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class KdcServer:
    def __init__(self, realm: str = REALM, clockskew: int = 300):
        self.realm = realm
        self.clockskew = clockskew
        self.dir = Path(tempfile.mkdtemp(prefix="shingle-kdc-"))
        self.port = free_udp_tcp_port()
        self.krb5_conf = self.dir / "krb5.conf"
        self.kdc_conf = self.dir / "kdc.conf"
        self.server_keytab = self.dir / "nfs.keytab"
        self.client_keytab = self.dir / "clients.keytab"
        self.log = self.dir / "kdc.log"
        self.proc: subprocess.Popen | None = None
        self._saved_env: dict[str, str | None] = {}

    def krb5_conf_text(self, kdc_host: str = "127.0.0.1") -> str:
        """krb5.conf for a client of this KDC (the VM's guest reaches it at another address)."""
        return (
            "[libdefaults]\n"
            f"  default_realm = {self.realm}\n"
            "  dns_lookup_kdc = false\n  dns_lookup_realm = false\n"
            "  rdns = false\n  dns_canonicalize_hostname = false\n"
            "  udp_preference_limit = 1\n"  # TCP: `kdc = tcp/...` does not work in 1.20
            f"  clockskew = {self.clockskew}\n"
            "[realms]\n"
            f"  {self.realm} = {{\n    kdc = {kdc_host}:{self.port}\n  }}\n"
        )

    def start(self) -> KdcServer:
        if not KDC_BIN.exists():
            raise RuntimeError(
                f"{KDC_BIN} not found: scripts/bootstrap.sh installs krb5-kdc and krb5-admin-server"
            )
        self.krb5_conf.write_text(self.krb5_conf_text())
        self.kdc_conf.write_text(
            "[kdcdefaults]\n"
            f"  kdc_listen = 127.0.0.1:{self.port}\n  kdc_tcp_listen = 127.0.0.1:{self.port}\n"
            "[realms]\n"
            f"  {self.realm} = {{\n"
            f"    database_name = {self.dir}/principal\n"
            f"    key_stash_file = {self.dir}/stash\n"
            f"    acl_file = {self.dir}/kadm5.acl\n"
            "    max_life = 10h 0m 0s\n"
            "  }\n"
            f"[logging]\n  kdc = FILE:{self.log}\n"
        )
        for key, path in (("KRB5_CONFIG", self.krb5_conf), ("KRB5_KDC_PROFILE", self.kdc_conf)):
            self._saved_env[key] = os.environ.get(key)
            os.environ[key] = str(path)
        self._run("kdb5_util", "create", "-s", "-r", self.realm, "-P", "kdc-master-password")
        self.add_service(f"nfs/{SERVER_HOST}", self.server_keytab)
        self.proc = subprocess.Popen(
            [str(KDC_BIN), "-n", "-r", self.realm],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"krb5kdc exited: see {self.log}") from None
                time.sleep(0.1)
        raise RuntimeError("krb5kdc did not listen within 20 s")

    def _run(self, *argv: str) -> str:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed: {done.stderr.strip()}")
        return done.stdout

    def kadmin(self, query: str) -> str:
        return self._run("kadmin.local", "-r", self.realm, "-q", query)

    def add_service(self, name: str, keytab: Path) -> str:
        """A principal with a random key, written to ``keytab``; its full name."""
        self.kadmin(f"addprinc -randkey {name}")
        self.kadmin(f"ktadd -k {keytab} {name}")
        return f"{name}@{self.realm}"

    def add_user(self, name: str, maxlife: str = "") -> str:
        """A user principal whose key goes to the clients' keytab (tests log in from it)."""
        life = f' -maxlife "{maxlife}"' if maxlife else ""
        self.kadmin(f"addprinc -randkey{life} {name}")
        self.kadmin(f"ktadd -k {self.client_keytab} {name}")
        return f"{name}@{self.realm}"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(self.dir, ignore_errors=True)
