"""Projects by name as an app last read them, so the webhook and results paths skip that look-up.

Every webhook and result names its project, and reading the row was one of a webhook's seven
statements. The service never changes a project once created (no route renames, edits or deletes
one), so a remembered row stays true; one edited or deleted by hand in the database is read again
once its entry is PROJECT_TTL_S old. Only projects found are remembered: a project created meanwhile,
by this process or another, is found at once. Each app (service.app.create_app) has its own, so
entries never cross databases.
"""

from __future__ import annotations

import copy
import threading
import time

from sqlalchemy.orm import Session, make_transient_to_detached

from service.models import Project
from service.usecases.projects import get_project

PROJECT_TTL_S = 30.0
_COLUMNS = tuple(Project.__table__.columns.keys())


class KnownProjects:
    def __init__(self, ttl_s: float = PROJECT_TTL_S, clock=time.monotonic) -> None:
        self.ttl_s, self.clock = ttl_s, clock
        self._entries: dict[str, tuple[float, dict]] = {}
        self._lock = threading.Lock()

    def get(self, session: Session, name: str) -> Project:
        """`get_project(session, name)` (NotFound included), from memory when read less than ttl_s
        ago. A remembered project comes back detached: its columns are all loaded, it belongs to no
        session, and changing it changes nothing stored (nor what others are given)."""
        entry = self._entries.get(name)
        if entry is not None and self.clock() < entry[0]:
            columns = entry[1]
            project = Project(**columns | {"settings": copy.deepcopy(columns["settings"])})
            make_transient_to_detached(project)
            return project
        project = get_project(session, name)
        columns = {column: getattr(project, column) for column in _COLUMNS}
        columns["settings"] = copy.deepcopy(columns["settings"])
        with self._lock:
            self._entries[name] = (self.clock() + self.ttl_s, columns)
        return project
