"""Create, list, revoke and check API tokens (`fusionwatch token ...`, service/auth.py).

A token is `fw_` and 43 URL-safe characters (256 random bits). It is returned once, when created;
the database keeps its SHA-256 and its first characters, so a stolen database holds no usable token.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.domain.vocabulary import TOKEN_SCOPES
from service.errors import Conflict, Invalid, NotFound
from service.models import ApiToken, Project
from service.usecases.projects import get_project

TOKEN_PREFIX = "fw_"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,99}")
_SHAPE = re.compile(r"fw_[A-Za-z0-9_-]{43}")
# Writing last_used_at on every request would turn every read into a write; a minute is precise enough.
_TOUCH_EVERY = timedelta(minutes=1)


@dataclass(frozen=True)
class Principal:
    """Who a request is: a token's name, scope and the one project it may write to (None: any)."""

    token_id: int
    name: str
    scope: str
    project_id: int | None
    project_name: str | None
    last_used_at: datetime | None = None

    @property
    def can_write(self) -> bool:
        return self.scope == "write"


@dataclass(frozen=True)
class CreatedToken:
    token: str  # the only time the token itself exists outside its holder's hands
    row: ApiToken


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, name: str, scope: str = "write", project: str | None = None) -> CreatedToken:
    name = name.strip()
    if not _NAME.fullmatch(name):
        raise Invalid(f"token name {name[:60]!r} must be 1 to 100 letters, digits, '.', '_', '@' or '-'")
    if scope not in TOKEN_SCOPES:
        raise Invalid(f"token scope {scope[:20]!r} must be one of {', '.join(TOKEN_SCOPES)}")
    project_id = get_project(session, project).id if project is not None else None
    if session.scalar(select(ApiToken.id).where(ApiToken.name == name)) is not None:
        raise Conflict(f"a token named {name!r} already exists; revoke it first or choose another name")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(name=name, token_hash=hash_token(token), prefix=token[:8], scope=scope, project_id=project_id)
    session.add(row)
    try:
        session.flush()
    except IntegrityError as error:  # a concurrent create of the same name
        raise Conflict(f"a token named {name!r} already exists") from error
    return CreatedToken(token, row)


def list_tokens(session: Session) -> list[tuple[ApiToken, str | None]]:
    """Every token, oldest first, with the name of the project it is limited to."""
    rows = session.execute(
        select(ApiToken, Project.name).outerjoin(Project, Project.id == ApiToken.project_id).order_by(ApiToken.id)
    ).all()
    return [(token, project) for token, project in rows]


def revoke_token(session: Session, name: str) -> ApiToken:
    row = session.scalar(select(ApiToken).where(ApiToken.name == name))
    if row is None:
        raise NotFound(f"no token named {name[:100]!r}")
    if row.revoked_at is None:
        row.revoked_at = datetime.now(UTC)
    known_tokens.forget(row.token_hash)
    return row


def authenticate(session: Session, token: str) -> Principal | None:
    """The token's principal, or None when it is malformed, unknown or revoked (the caller says 401).
    Only reads: every request asks, so it must not take a write lock (see `note_use`)."""
    if not _SHAPE.fullmatch(token):
        return None
    found = session.execute(
        select(ApiToken, Project.name)
        .outerjoin(Project, Project.id == ApiToken.project_id)
        .where(ApiToken.token_hash == hash_token(token))
    ).first()
    if found is None or found[0].revoked_at is not None:
        return None
    row, project_name = found
    return Principal(row.id, row.name, row.scope, row.project_id, project_name, row.last_used_at)


def use_is_stale(principal: Principal) -> bool:
    last = principal.last_used_at
    return last is None or datetime.now(UTC) - last > _TOUCH_EVERY


def note_use(session: Session, principal: Principal) -> None:
    """Record when the token was last used (shown by `fusionwatch token list`)."""
    session.execute(update(ApiToken).where(ApiToken.id == principal.token_id).values(last_used_at=datetime.now(UTC)))


class KnownTokens:
    """Principals recently authenticated, by token hash and database, for `PRINCIPAL_TTL_S`.

    Every API request shows its token, and looking it up (a session, a query) was a tenth of a
    webhook's CPU time. A token revoked in this process is forgotten at once (`revoke_token`); one
    revoked by another process (`fusionwatch token revoke` is one) stops working here within
    PRINCIPAL_TTL_S, when its entry expires and the database is asked again. Unknown and revoked
    tokens are never remembered, so a token created meanwhile works at once."""

    def __init__(self, ttl_s: float, clock=time.monotonic) -> None:
        self.ttl_s, self.clock = ttl_s, clock
        self._entries: dict[tuple[str, str], tuple[float, Principal]] = {}
        self._lock = threading.Lock()

    def get(self, database: str, token_hash: str) -> Principal | None:
        entry = self._entries.get((database, token_hash))
        if entry is None:
            return None
        expires, principal = entry
        if self.clock() >= expires:
            with self._lock:
                if self._entries.get((database, token_hash)) is entry:
                    del self._entries[(database, token_hash)]
            return None
        return principal

    def remember(self, database: str, token_hash: str, principal: Principal) -> None:
        with self._lock:
            self._entries[(database, token_hash)] = (self.clock() + self.ttl_s, principal)

    def refresh(self, database: str, token_hash: str, principal: Principal) -> None:
        """`principal` again, its expiry unchanged (e.g. with a new last_used_at)."""
        with self._lock:
            entry = self._entries.get((database, token_hash))
            if entry is not None:
                self._entries[(database, token_hash)] = (entry[0], principal)

    def forget(self, token_hash: str) -> None:
        with self._lock:
            for key in [key for key in self._entries if key[1] == token_hash]:
                del self._entries[key]


PRINCIPAL_TTL_S = 5.0
known_tokens = KnownTokens(PRINCIPAL_TTL_S)


def well_formed(token: str) -> bool:
    return _SHAPE.fullmatch(token) is not None


def remembered_principal(database: str, token: str) -> Principal | None:
    """The principal `authenticate` found for `token` on `database` less than PRINCIPAL_TTL_S ago, or None."""
    return known_tokens.get(database, hash_token(token)) if well_formed(token) else None


def authenticate_remembered(session: Session, database: str, token: str) -> Principal | None:
    """`authenticate`, through `known_tokens`."""
    found = remembered_principal(database, token)
    if found is None:
        found = authenticate(session, token)
        if found is not None:
            known_tokens.remember(database, hash_token(token), found)
    return found


def noted_use(database: str, token: str, principal: Principal) -> Principal:
    """`principal` as `note_use` just left it, remembered so (its last use is not noted again for a minute)."""
    noted = replace(principal, last_used_at=datetime.now(UTC))
    known_tokens.refresh(database, hash_token(token), noted)
    return noted
