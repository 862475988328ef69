"""The service's tables, one per module. Importing this package registers all of them on `Base.metadata`
(Alembic's env.py and the migration-drift test rely on that)."""

from service.models.alert import Alert
from service.models.alert_delivery import AlertDelivery
from service.models.api_token import ApiToken
from service.models.base import Base
from service.models.change_point_window import ChangePointWindow
from service.models.commit import Commit
from service.models.feed_set import FeedSet
from service.models.history_point import HistoryPoint
from service.models.hook import Hook
from service.models.job import Job
from service.models.machine import Machine
from service.models.model import Model
from service.models.model_file import ModelFile
from service.models.project import Project
from service.models.result import Result
from service.models.result_fusion import ResultFusion
from service.models.run import Run
from service.models.webhook_delivery import WebhookDelivery

__all__ = [
    "Alert",
    "AlertDelivery",
    "ApiToken",
    "Base",
    "ChangePointWindow",
    "Commit",
    "FeedSet",
    "HistoryPoint",
    "Hook",
    "Job",
    "Machine",
    "Model",
    "ModelFile",
    "Project",
    "Result",
    "ResultFusion",
    "Run",
    "WebhookDelivery",
]
