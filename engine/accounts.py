"""Admin accounts and API tokens for the web UI, kept in the catalog.

Passwords are hashed with scrypt (werkzeug's default KDF, memory-hard);
API tokens are random and stored only as SHA-256 digests, so a leaked
catalog reveals neither."""
from __future__ import annotations

import hashlib
import re
import secrets
import time

from sqlalchemy import select
from werkzeug.security import check_password_hash, generate_password_hash

from engine import errors
from engine.catalog.database import Catalog
from engine.catalog.models import AdminUser, ApiToken
from engine.events import record_in

USERS = AdminUser.__table__
TOKENS = ApiToken.__table__
USERNAME_RE = re.compile(r"[a-z_][a-z0-9_.-]{0,63}")
MIN_PASSWORD = 10


def hash_password(password: str) -> str:
    return generate_password_hash(password, method="scrypt")


def create_admin(catalog: Catalog, username: str, password: str, *, actor: str = "system") -> int:
    if not USERNAME_RE.fullmatch(username):
        raise errors.InvalidArgument(f"username {username!r}: expected lower-case letters, digits, _ . - "
                                     "(starting with a letter or _), at most 64")
    if len(password) < MIN_PASSWORD:
        raise errors.InvalidArgument(f"password of {len(password)} characters: expected at least {MIN_PASSWORD}")
    digest = hash_password(password)

    def work(conn):
        if conn.execute(select(USERS.c.id).where(USERS.c.username == username)).first():
            raise errors.Exists(f"admin user {username!r} exists")
        user_id = conn.execute(USERS.insert().values(
            username=username, password_hash=digest, created_ns=time.time_ns(), failed_logins=0,
        )).inserted_primary_key[0]
        record_in(conn, "admin.user.create", f"admin user {username} created", actor=actor)
        return user_id
    return catalog.run(work)


def verify_login(catalog: Catalog, username: str, password: str) -> int | None:
    """The user's id if the password is right, else None (failures are counted)."""
    def load(conn):
        return conn.execute(select(USERS).where(USERS.c.username == username)).first()
    row = catalog.read(load)
    if row is None:
        check_password_hash(hash_password("x" * MIN_PASSWORD), password)  # same cost either way
        return None
    ok = check_password_hash(row.password_hash, password)

    def update(conn):
        if ok:
            conn.execute(USERS.update().where(USERS.c.id == row.id).values(
                failed_logins=0, last_login_ns=time.time_ns()))
        else:
            conn.execute(USERS.update().where(USERS.c.id == row.id).values(failed_logins=USERS.c.failed_logins + 1))
    catalog.run(update)
    return row.id if ok else None


def set_password(catalog: Catalog, username: str, password: str, *, actor: str = "system") -> None:
    if len(password) < MIN_PASSWORD:
        raise errors.InvalidArgument(f"password of {len(password)} characters: expected at least {MIN_PASSWORD}")
    digest = hash_password(password)

    def work(conn):
        if not conn.execute(USERS.update().where(USERS.c.username == username).values(password_hash=digest)).rowcount:
            raise errors.NotFound(f"no admin user {username!r}")
        record_in(conn, "admin.user.password", f"password of {username} changed", actor=actor)
    catalog.run(work)


def _token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(catalog: Catalog, user_id: int, name: str, *, actor: str = "system") -> str:
    """A new API token; only its digest is stored, so this is the one chance to see it."""
    token = "shg_" + secrets.token_urlsafe(32)

    def work(conn):
        conn.execute(TOKENS.insert().values(user_id=user_id, name=name, token_hash=_token_digest(token),
                                            created_ns=time.time_ns()))
        record_in(conn, "admin.token.create", f"API token {name!r} created", actor=actor)
    catalog.run(work)
    return token


def user_for_token(catalog: Catalog, token: str) -> tuple[int, str] | None:
    digest = _token_digest(token)

    def work(conn):
        row = conn.execute(select(TOKENS.c.id, USERS.c.id, USERS.c.username)
                           .select_from(TOKENS.join(USERS, TOKENS.c.user_id == USERS.c.id))
                           .where(TOKENS.c.token_hash == digest)).first()
        if row is None:
            return None
        conn.execute(TOKENS.update().where(TOKENS.c.id == row[0]).values(last_used_ns=time.time_ns()))
        return row[1], row[2]
    return catalog.run(work)
