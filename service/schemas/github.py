"""The parts of a GitHub delivery the service reads, typed and bounded (the rest is ignored).

GitHub documents a push's `commits` as at most 2,048 entries, and a push can list tens of thousands
(a mirror's first push). Each listed commit is a row, so beyond MAX_PUSH_COMMITS only the head and its
parent are recorded: bisecting then has the pushed range's ends, and a 40,000-commit push is answered
in well under a second instead of a minute.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, StringConstraints, model_validator

from service.schemas.fields import Sha, line

MAX_PUSH_COMMITS = 250

# GitHub's texts are stored cut to their columns (usecases/commits.py), not refused for being long.
_Message = Annotated[str, StringConstraints(max_length=1_000_000, pattern=r"^[^\x00]*$")]


class Repository(BaseModel):
    name: line(200) | None = None


class Delivery(BaseModel):
    """What every event's payload is read for: the repository naming the project."""

    repository: Repository | None = None


class PushAuthor(BaseModel):
    name: line(1000) | None = None
    username: line(1000) | None = None


class PushCommit(BaseModel):
    id: Sha
    message: _Message = ""
    timestamp: datetime | None = None
    author: PushAuthor | None = None

    def author_name(self) -> str:
        return (self.author.name or self.author.username or "") if self.author else ""


class GitHubPush(Delivery):
    ref: line(1000) = ""
    before: line(64) | None = None
    head_commit: PushCommit | None = None
    commits: list[PushCommit] = []

    @model_validator(mode="before")
    @classmethod
    def _validate_only_what_is_recorded(cls, data: Any) -> Any:
        """Entries beyond the cap are never read: validating 40,000 of them took a second."""
        if isinstance(data, dict) and isinstance(data.get("commits"), list) and len(data["commits"]) > MAX_PUSH_COMMITS + 2:
            data = {**data, "commits": data["commits"][-(MAX_PUSH_COMMITS + 2):]}
        return data

    def listed_before_head(self) -> tuple[str | None, list[PushCommit]]:
        """(the parent of the first, the commits the push lists before its head, oldest first); beyond
        MAX_PUSH_COMMITS only the head's parent, with its own parent."""
        head = self.head_commit.id if self.head_commit else None
        listed = [c for c in self.commits if c.id != head]
        if len(listed) <= MAX_PUSH_COMMITS:
            return self.before, listed
        return listed[-2].id, listed[-1:]
