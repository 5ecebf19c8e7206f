"""Admin accounts and API tokens as the settings page lists them, and revoking a token.

Creating accounts and tokens, passwords and sign-in checks are engine.admin.accounts;
this module only reads them (never a secret or a hash) and removes tokens (engine.admin.crud)."""

from __future__ import annotations

from sqlalchemy import select

from engine.admin.crud import CrudService
from engine.base import errors
from engine.catalog.database import Catalog
from engine.catalog.models import AdminUser, ApiToken

USERS = AdminUser.__table__
TOKENS = ApiToken.__table__


def user_id(catalog: Catalog, username: str) -> int:
    query = select(USERS.c.id).where(USERS.c.username == username)
    uid = catalog.read(lambda c: c.execute(query).scalar())
    if uid is None:
        raise errors.NotFound(f"no admin user {username!r}")
    return uid


def list_admins(catalog: Catalog) -> list[dict]:
    """id, username, created_ns, last_login_ns, failed_logins of every admin, by id."""
    query = select(
        USERS.c.id,
        USERS.c.username,
        USERS.c.created_ns,
        USERS.c.last_login_ns,
        USERS.c.failed_logins,
    ).order_by(USERS.c.id)
    return catalog.read(lambda c: [dict(r._mapping) for r in c.execute(query)])


def list_tokens(catalog: Catalog) -> list[dict]:
    """id, name, scope, created_ns, expires_ns, last_used_ns and the owner's username of every
    API token."""
    query = (
        select(
            TOKENS.c.id,
            TOKENS.c.name,
            TOKENS.c.scope,
            TOKENS.c.created_ns,
            TOKENS.c.expires_ns,
            TOKENS.c.last_used_ns,
            USERS.c.username,
        )
        .select_from(TOKENS.join(USERS, USERS.c.id == TOKENS.c.user_id))
        .order_by(TOKENS.c.id)
    )
    return catalog.read(lambda c: [dict(r._mapping) for r in c.execute(query)])


class _Tokens(CrudService[dict]):
    delete_verb = "revoke"

    def deleted(self, row) -> str:
        return f"API token {row.name!r} revoked"


TOKEN_SERVICE = _Tokens(
    TOKENS,
    lambda row: dict(row._mapping),
    noun="API token",
    event_prefix="admin.token",
    id_key="token_id",
)


def revoke_token(catalog: Catalog, token_id: int, *, actor: str) -> None:
    TOKEN_SERVICE.delete(catalog, token_id, actor=actor)
