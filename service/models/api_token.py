"""An API token: who may upload, post results and acknowledge alerts, and who may read.

Only the SHA-256 of the token is kept. Tokens are 256 random bits, so a fast hash is enough (there
is nothing to brute-force) and a lookup by hash is one indexed read. `project_id` set: the token
writes to that project only. `prefix` (the first characters) lets people tell their tokens apart.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from service.domain.vocabulary import TOKEN_SCOPES, one_of
from service.models.base import Base, UtcDateTime, utc_now


class ApiToken(Base):
    __tablename__ = "api_token"
    __table_args__ = (CheckConstraint(one_of("scope", TOKEN_SCOPES), name="scope_known"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    scope: Mapped[str] = mapped_column(String(16))
    project_id: Mapped[int | None] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
    last_used_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
