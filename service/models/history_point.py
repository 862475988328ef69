"""One point of a series' history: the latest result of a (model, engine, level, machine class) series
at one commit, with that point's JSON as a history reply carries it, written when the result is stored
(usecases/history_points.py).

A read of 10,000 commits is then one range of one index, the points spliced into the reply as they
are, instead of finding each commit's latest result among all of them, joining its commit and
rendering it (150-180 ms on a first read, 2026-11-24). A commit's points are rendered again when the
commit gains a message or a timestamp it lacked (usecases/commits.py: record_commit). Rows go with
their result, commit, model or project, and results are only deleted with one of those.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, ForeignKey, Index, Integer, Sequence, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base


class HistoryPoint(Base):
    __tablename__ = "history_point"
    __table_args__ = (
        # A series' points in commit order (commits are numbered as they arrive: seq).
        Index("ix_history_point_series", "project_id", "model_id", "engine", "level", "machine_class", "commit_seq",
              "result_id", "version"),
    )

    # The series, as result's columns name it, and the commit: one point each.
    model_id: Mapped[int] = mapped_column(ForeignKey("model.id", ondelete="CASCADE"), primary_key=True)
    engine: Mapped[str] = mapped_column(String(32), primary_key=True)
    level: Mapped[str] = mapped_column(String(16), primary_key=True)
    machine_class: Mapped[str] = mapped_column(String(32), primary_key=True)
    commit_id: Mapped[int] = mapped_column(ForeignKey("commit.id", ondelete="CASCADE"), primary_key=True,
                                           index=True)  # a commit's points, rendered again when it is filled in
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    commit_seq: Mapped[int] = mapped_column(Integer)
    sha: Mapped[str] = mapped_column(String(64))
    result_id: Mapped[int] = mapped_column(ForeignKey("result.id", ondelete="CASCADE"), index=True)
    p10_ms: Mapped[float | None] = mapped_column(Float)
    point: Mapped[str] = mapped_column(Text)  # the point's JSON (usecases/history_points.py: render_point)
    # Taken afresh by every write of the row, each larger than every version before it (PostgreSQL:
    # VERSIONS; SQLite, which writes one transaction at a time: the largest so far, plus one). So a
    # series' count and sum of versions change whenever its points do (usecases/history_points.py).
    version: Mapped[int] = mapped_column(BigInteger, index=True)


VERSIONS = Sequence("history_point_version_seq")  # PostgreSQL's source of history_point.version
