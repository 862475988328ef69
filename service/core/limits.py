"""The hostile-input limits from the settings, in the optimizer's and the upload's terms."""

from __future__ import annotations

from dataclasses import dataclass

from optimizer import LoadLimits
from service.core.config import Settings, settings


@dataclass(frozen=True)
class UploadLimits:
    """What an upload may be: its bytes on the wire, and the model it holds once loaded."""

    max_bytes: int
    load: LoadLimits


def load_limits(config: Settings = settings) -> LoadLimits:
    return LoadLimits(max_nodes=config.max_nodes, max_tensor_bytes=config.max_tensor_mb * 1024**2)


def upload_limits(config: Settings = settings) -> UploadLimits:
    return UploadLimits(max_bytes=config.max_upload_mb * 1024**2, load=load_limits(config))
