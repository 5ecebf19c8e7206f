"""A throw-away PostgreSQL 15 server for tests and benchmarks.

initdb refuses root, so it runs as the postgres user; socket and data live in
a temp folder, and the server is our child process so the run reaps it."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

PG_BIN = Path(os.environ.get("SHINGLE_PG_BIN", "/usr/lib/postgresql/15/bin"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    def __init__(self, settings: dict[str, str] | None = None):
        """``settings`` override the server's (fsync and synchronous_commit are off by default:
        a benchmark of durable commits turns them on)."""
        self.settings = {"fsync": "off", "synchronous_commit": "off", **(settings or {})}
        self.dir = Path(tempfile.mkdtemp(prefix="shingle-pg-"))
        self.port = free_port()
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.proc = None
        self._template: str | None = None  # see create_migrated_database

    def start(self):
        if not (PG_BIN / "initdb").exists():
            raise RuntimeError(
                f"PostgreSQL binaries not found in {PG_BIN}: run the README test command, "
                "which installs postgresql"
            )
        pw = pwd.getpwnam("postgres")
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run(
            as_postgres
            + [
                str(PG_BIN / "initdb"),
                "-D",
                str(self.data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
        )
        return self.resume()

    def resume(self):
        """Start the server (again, after ``halt``) on its data and port;
        returns when it is ready."""
        as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        # postgres runs as our child (not daemonized by pg_ctl) so this run reaps it.
        self.proc = subprocess.Popen(
            as_postgres
            + [
                str(PG_BIN / "postgres"),
                "-D",
                str(self.data),
                "-c",
                "listen_addresses=127.0.0.1",
                "-p",
                str(self.port),
                "-k",
                str(self.dir),
                "-c",
                "max_connections=300",
            ]
            + [arg for key, value in self.settings.items() for arg in ("-c", f"{key}={value}")],
            stdout=open(self.log, "ab"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready = subprocess.run(
                [str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True,
            )
            if ready.returncode == 0:
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"PostgreSQL did not start: {self.log.read_text()[-2000:]}")

    def url(self, dbname: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self) -> str:
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def create_migrated_database(self) -> str:
        """A new database at the head revision, as ``upgrade(create_database())`` leaves it:
        the first call migrates a template database, later ones copy it (CREATE DATABASE
        ... TEMPLATE), which costs a fraction of running every revision."""
        import psycopg

        if self._template is None:
            from engine.catalog import upgrade

            template = self.create_database()
            upgrade(template)  # its engine is disposed: no session is left on the template
            self._template = template.rsplit("/", 1)[1]
        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"')
        return self.url(name)

    def halt(self):
        """An outage: a fast shutdown (SIGINT: open sessions are cut, as ``pg_ctl stop`` does),
        keeping the data for ``resume``."""
        # to the postmaster itself: runuser passes SIGTERM on, not SIGINT
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGINT)
        self.proc.wait(30)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
