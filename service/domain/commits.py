"""A commit as a submission describes it, before it is recorded."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass
class CommitInfo:
    sha: str
    branch: str = "main"
    parents: list[str] = field(default_factory=list)
    message: str = ""
    author: str = ""
    timestamp: datetime | None = None
