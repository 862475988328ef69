"""The service's tables, one per module. Importing this package registers all of them on `Base.metadata`
(Alembic's env.py and the migration-drift test rely on that)."""

from service.models.base import Base
from service.models.model import OnnxModel
from service.models.optimizer_run import OptimizerRun

__all__ = ["Base", "OnnxModel", "OptimizerRun"]
