"""A real PostgreSQL server for the results-store tests: initdb in a temporary
directory, started on a free port of 127.0.0.1 (its socket directory inside that
directory), stopped at the end of the session.  The binaries come from Debian's
``postgresql`` package (`make postgres` installs it); PostgreSQL refuses to run as
root, so as root the server runs as the ``postgres`` user (or ``nobody``)."""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from kubetune.devcluster.processes import free_port

__all__ = ["postgres_server", "postgres_url", "PostgresServer"]


def _bin_dir() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    return Path(candidates[-1]).parent if candidates else None


class PostgresServer:
    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="kubetune-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.user = None
        if os.geteuid() == 0:
            self.user = next((u for u in ("postgres", "nobody") if _user_exists(u)), None)
            if self.user is None:
                raise RuntimeError("running as root, and neither a postgres nor a nobody user exists")
            account = pwd.getpwnam(self.user)
            os.chown(self.root, account.pw_uid, account.pw_gid)
        self.root.chmod(0o700)

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    def start(self) -> "PostgresServer":
        result = self._run("initdb", "-D", str(self.data), "-U", "kubetune", "--auth=trust", "-E", "UTF8",
                           "--no-sync")
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed: {result.stdout}{result.stderr}")
        # fsync off: a test database is thrown away (and the machine is shared)
        options = f"-h 127.0.0.1 -p {self.port} -k {self.root} -F"
        result = self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "server.log"),
                           "-w", "-t", "60", "start")
        if result.returncode != 0:
            log = (self.root / "server.log").read_text() if (self.root / "server.log").exists() else ""
            raise RuntimeError(f"postgres did not start: {result.stdout}{result.stderr}{log[-3000:]}")
        return self

    def create_database(self, name: str) -> str:
        import psycopg
        with psycopg.connect(self.admin_url("postgres"), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def admin_url(self, database: str) -> str:
        return f"postgresql://kubetune@127.0.0.1:{self.port}/{database}"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://kubetune@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture(scope="session")
def postgres_server():
    bin_dir = _bin_dir()
    if bin_dir is None:
        pytest.fail("PostgreSQL's server binaries are missing: run `make postgres` (Debian's postgresql package)")
    server = PostgresServer(bin_dir).start()
    try:
        yield server
    finally:
        server.stop()


_databases = iter(range(1, 1_000_000))


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """A fresh, empty database on the session's server."""
    return postgres_server.create_database(f"kubetune_{os.getpid()}_{next(_databases)}_{int(time.time())}")
