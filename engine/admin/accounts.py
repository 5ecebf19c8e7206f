"""Admin accounts, their web sessions, API tokens and the sign-in throttle, kept in the catalog.

Passwords are hashed with scrypt (werkzeug's default KDF, memory-hard);
session ids and API tokens are random and stored only as SHA-256 digests, so
a leaked catalog reveals none of them.

- Sessions are rows (``admin_sessions``): signing out, a password change and
  removing the admin delete them, so a copied cookie stops working then.
- API tokens carry a scope (``SCOPES``: read-only < operator < admin) and an
  expiry; the web UI checks the scope on every API route.
- Failed sign-ins back off per source address, per account and per account
  from one address (``THROTTLES``), in the catalog so every web UI worker
  shares them. Nothing is locked for good: once the back-off has passed the
  right password works, and guesses from one address never slow another
  address down until the account-wide allowance (``ACCOUNT_FREE``) is spent."""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import select

from engine.admin.events import record_in
from engine.base import errors
from engine.catalog.database import Catalog
from engine.catalog.models import AdminSession, AdminUser, ApiToken, LoginThrottle

USERS = AdminUser.__table__
TOKENS = ApiToken.__table__
SESSIONS = AdminSession.__table__
THROTTLE = LoginThrottle.__table__
USERNAME_RE = re.compile(r"[a-z_][a-z0-9_.-]{0,63}")
MIN_PASSWORD = 10

SCOPES = ("read-only", "operator", "admin")
SESSION_S = 12 * 3600  # a session ends this long after sign-in ...
SESSION_IDLE_S = 2 * 3600  # ... or after this long unused
SESSION_TOUCH_S = 60  # last_seen is written at most this often (not on every request)

# (free failures, first back-off s, longest back-off s) per throttle key kind
ADDRESS_FREE, ACCOUNT_FROM_ADDRESS_FREE, ACCOUNT_FREE = 20, 5, 100
THROTTLES = {
    "address": (ADDRESS_FREE, 1.0, 15 * 60.0),
    "account-from-address": (ACCOUNT_FROM_ADDRESS_FREE, 1.0, 15 * 60.0),
    # Guesses from many addresses: slows them, and delays the owner a minute at most.
    "account": (ACCOUNT_FREE, 1.0, 60.0),
}
THROTTLE_FORGET_S = 15 * 60  # failures this old (and no back-off running) are forgotten
NS = 10**9


def hash_password(password: str) -> str:
    from werkzeug.security import generate_password_hash

    return generate_password_hash(password, method="scrypt")


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_admin(catalog: Catalog, username: str, password: str, *, actor: str = "system") -> int:
    if not USERNAME_RE.fullmatch(username):
        raise errors.InvalidArgument(
            f"username {username!r}: expected lower-case letters, digits, _ . - "
            "(starting with a letter or _), at most 64"
        )
    if len(password) < MIN_PASSWORD:
        raise errors.InvalidArgument(
            f"password of {len(password)} characters: expected at least {MIN_PASSWORD}"
        )
    digest = hash_password(password)

    def work(conn):
        if conn.execute(select(USERS.c.id).where(USERS.c.username == username)).first():
            raise errors.Exists(f"admin user {username!r} exists")
        user_id = conn.execute(
            USERS.insert().values(
                username=username,
                password_hash=digest,
                created_ns=time.time_ns(),
                failed_logins=0,
            )
        ).inserted_primary_key[0]
        record_in(conn, "admin.user.create", f"admin user {username} created", actor=actor)
        return user_id

    return catalog.run(work)


def delete_admin(catalog: Catalog, username: str, *, actor: str = "system") -> None:
    """Remove an admin with every session and API token of theirs; the last admin stays."""

    def work(conn):
        user_id = conn.execute(select(USERS.c.id).where(USERS.c.username == username)).scalar()
        if user_id is None:
            raise errors.NotFound(f"no admin user {username!r}")
        if conn.execute(select(USERS.c.id).where(USERS.c.id != user_id).limit(1)).first() is None:
            raise errors.InvalidArgument(
                f"admin user {username!r} is the last admin: create another one first"
            )
        # Explicit, not only ON DELETE CASCADE: a connection without foreign keys must not leave
        # a session or token that outlives its admin.
        conn.execute(SESSIONS.delete().where(SESSIONS.c.user_id == user_id))
        conn.execute(TOKENS.delete().where(TOKENS.c.user_id == user_id))
        conn.execute(USERS.delete().where(USERS.c.id == user_id))
        record_in(
            conn,
            "admin.user.delete",
            f"admin user {username} removed with their sessions and API tokens",
            actor=actor,
        )

    catalog.run(work)


def verify_login(catalog: Catalog, username: str, password: str) -> int | None:
    """The user's id if the password is right, else None (failures are counted)."""
    from werkzeug.security import check_password_hash

    row = catalog.read(
        lambda conn: conn.execute(select(USERS).where(USERS.c.username == username)).first()
    )
    if row is None:
        check_password_hash(hash_password("x" * MIN_PASSWORD), password)  # same cost either way
        return None
    ok = check_password_hash(row.password_hash, password)

    def update(conn):
        if ok:
            conn.execute(
                USERS.update()
                .where(USERS.c.id == row.id)
                .values(failed_logins=0, last_login_ns=time.time_ns())
            )
        else:
            conn.execute(
                USERS.update()
                .where(USERS.c.id == row.id)
                .values(failed_logins=USERS.c.failed_logins + 1)
            )

    catalog.run(update)
    return row.id if ok else None


def set_password(
    catalog: Catalog,
    username: str,
    password: str,
    *,
    actor: str = "system",
    keep_session: str | None = None,
) -> None:
    """Change a password and end every session of that admin but ``keep_session`` (the one that
    asked for the change, if any)."""
    if len(password) < MIN_PASSWORD:
        raise errors.InvalidArgument(
            f"password of {len(password)} characters: expected at least {MIN_PASSWORD}"
        )
    digest = hash_password(password)
    kept = _digest(keep_session) if keep_session else None

    def work(conn):
        user_id = conn.execute(select(USERS.c.id).where(USERS.c.username == username)).scalar()
        if user_id is None:
            raise errors.NotFound(f"no admin user {username!r}")
        conn.execute(USERS.update().where(USERS.c.id == user_id).values(password_hash=digest))
        ended = SESSIONS.delete().where(SESSIONS.c.user_id == user_id)
        if kept:
            ended = ended.where(SESSIONS.c.token_hash != kept)
        conn.execute(ended)
        record_in(
            conn,
            "admin.user.password",
            f"password of {username} changed; its other sessions ended",
            actor=actor,
        )

    catalog.run(work)


# -- sessions ------------------------------------------------------------------------------------
def open_session(catalog: Catalog, user_id: int, address: str) -> str:
    """A new session for a signed-in admin; the returned id goes into the (signed) cookie."""
    session_id = secrets.token_urlsafe(32)
    now = time.time_ns()

    def work(conn):
        # Ended sessions are not kept: sign-in is where old rows of anyone go.
        conn.execute(
            SESSIONS.delete().where(
                (SESSIONS.c.expires_ns < now)
                | (SESSIONS.c.last_seen_ns < now - SESSION_IDLE_S * NS)
            )
        )
        conn.execute(
            SESSIONS.insert().values(
                user_id=user_id,
                token_hash=_digest(session_id),
                address=address[:64],
                created_ns=now,
                last_seen_ns=now,
                expires_ns=now + SESSION_S * NS,
            )
        )

    catalog.run(work)
    return session_id


def session_admin(catalog: Catalog, session_id: str) -> str | None:
    """The admin a live session belongs to, or None (unknown, ended, expired or idle too long)."""
    digest = _digest(session_id)
    now = time.time_ns()
    row = catalog.read(
        lambda conn: conn.execute(
            select(SESSIONS.c.id, SESSIONS.c.last_seen_ns, SESSIONS.c.expires_ns, USERS.c.username)
            .select_from(SESSIONS.join(USERS, USERS.c.id == SESSIONS.c.user_id))
            .where(SESSIONS.c.token_hash == digest)
        ).first()
    )
    if row is None or row.expires_ns <= now or row.last_seen_ns <= now - SESSION_IDLE_S * NS:
        return None
    if row.last_seen_ns < now - SESSION_TOUCH_S * NS:
        catalog.run(
            lambda conn: conn.execute(
                SESSIONS.update().where(SESSIONS.c.id == row.id).values(last_seen_ns=now)
            )
        )
    return row.username


def end_session(catalog: Catalog, session_id: str) -> None:
    catalog.run(
        lambda conn: conn.execute(
            SESSIONS.delete().where(SESSIONS.c.token_hash == _digest(session_id))
        )
    )


# -- API tokens ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenIdentity:
    user_id: int
    username: str
    scope: str


def scope_allows(scope: str | None, needed: str) -> bool:
    """Whether ``scope`` includes ``needed`` (read-only < operator < admin)."""
    return scope in SCOPES and SCOPES.index(scope) >= SCOPES.index(needed)


def create_token(
    catalog: Catalog,
    user_id: int,
    name: str,
    *,
    scope: str = "read-only",
    expires_s: float | None = None,
    actor: str = "system",
) -> str:
    """A new API token (``expires_s`` from now, None: never); only its digest is stored, so this
    is the one chance to see it."""
    if scope not in SCOPES:
        raise errors.InvalidArgument(f"token scope {scope!r}: expected one of {', '.join(SCOPES)}")
    token = "shg_" + secrets.token_urlsafe(32)
    now = time.time_ns()
    expires_ns = None if expires_s is None else now + int(expires_s * NS)

    def work(conn):
        conn.execute(
            TOKENS.insert().values(
                user_id=user_id,
                name=name,
                token_hash=_digest(token),
                created_ns=now,
                scope=scope,
                expires_ns=expires_ns,
            )
        )
        until = "never expires" if expires_s is None else f"expires in {expires_s / 86400:g} days"
        record_in(
            conn,
            "admin.token.create",
            f"API token {name!r} ({scope}) created; {until}",
            actor=actor,
        )

    catalog.run(work)
    return token


def token_identity(catalog: Catalog, token: str) -> TokenIdentity | None:
    """Who a token acts for and with which scope; None if unknown or expired."""
    digest = _digest(token)
    now = time.time_ns()

    def work(conn):
        row = conn.execute(
            select(
                TOKENS.c.id,
                TOKENS.c.scope,
                TOKENS.c.expires_ns,
                USERS.c.id.label("uid"),
                USERS.c.username,
            )
            .select_from(TOKENS.join(USERS, TOKENS.c.user_id == USERS.c.id))
            .where(TOKENS.c.token_hash == digest)
        ).first()
        if row is None or (row.expires_ns is not None and row.expires_ns <= now):
            return None
        conn.execute(TOKENS.update().where(TOKENS.c.id == row.id).values(last_used_ns=now))
        return TokenIdentity(row.uid, row.username, row.scope)

    return catalog.run(work)


def user_for_token(catalog: Catalog, token: str) -> tuple[int, str] | None:
    found = token_identity(catalog, token)
    return None if found is None else (found.user_id, found.username)


# -- sign-in throttle ------------------------------------------------------------------------------
def _throttle_keys(username: str, address: str) -> dict[str, str]:
    username, address = username[:64], address[:64]
    return {
        "address": f"address {address}",
        "account": f"account {username}",
        "account-from-address": f"account {username} from {address}",
    }


def login_wait_s(catalog: Catalog, username: str, address: str) -> float:
    """Seconds until a sign-in as ``username`` from ``address`` may be tried (0: now)."""
    keys = list(_throttle_keys(username, address).values())
    now = time.time_ns()
    until = catalog.read(
        lambda conn: (
            conn.execute(select(THROTTLE.c.blocked_until_ns).where(THROTTLE.c.key.in_(keys)))
            .scalars()
            .all()
        )
    )
    return max([0.0] + [(u - now) / NS for u in until])


def login_failed(catalog: Catalog, username: str, address: str, *, actor: str = "webui") -> float:
    """Count a failed sign-in; the seconds of back-off it imposes (0: none yet)."""
    now = time.time_ns()

    def work(conn):
        conn.execute(
            THROTTLE.delete().where(
                THROTTLE.c.last_failure_ns < now - THROTTLE_FORGET_S * NS,
                THROTTLE.c.blocked_until_ns < now,
            )
        )
        imposed = 0.0
        for kind, key in _throttle_keys(username, address).items():
            free, first_s, longest_s = THROTTLES[kind]
            before = conn.execute(select(THROTTLE.c.failures).where(THROTTLE.c.key == key)).scalar()
            failures = (before or 0) + 1
            wait = min(first_s * 2 ** (failures - free - 1), longest_s) if failures > free else 0.0
            values = dict(
                failures=failures, last_failure_ns=now, blocked_until_ns=now + int(wait * NS)
            )
            if before is None:
                conn.execute(THROTTLE.insert().values(key=key, **values))
            else:
                conn.execute(THROTTLE.update().where(THROTTLE.c.key == key).values(**values))
            if wait:
                record_in(
                    conn,
                    "auth.throttled",
                    f"sign-in for {key} held back {wait:.0f} s after {failures} failures",
                    severity="warning",
                    actor=actor[:64],
                )
            imposed = max(imposed, wait)
        return imposed

    return catalog.run(work)


def login_succeeded(catalog: Catalog, username: str, address: str) -> None:
    """A right password clears the account's counts (the address's stays: it may spray names)."""
    keys = _throttle_keys(username, address)
    catalog.run(
        lambda conn: conn.execute(
            THROTTLE.delete().where(
                THROTTLE.c.key.in_([keys["account"], keys["account-from-address"]])
            )
        )
    )
