"""Request bodies the API accepts (JSON); multipart forms are declared on their routes.

Every field is typed and bounded (service/schemas/fields.py): a document outside the bounds is a 422
naming the field before anything is stored.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from service.domain.vocabulary import ENGINES, LEVEL_NAMES
from service.schemas.fields import (
    INT64_MAX,
    Count,
    Error,
    Key,
    Milliseconds,
    ModelName,
    ProjectName,
    Sha,
    ShareMs,
    Text,
    line,
)
from service.schemas.numerics import MAX_FEED_SETS, DivergenceIn, NumericCheckIn
from service.usecases.results import MAX_NEAR_MISSES, MAX_SAMPLES


class ProjectCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    webhook_secret: str | None = Field(None, max_length=200)
    settings: dict[str, Any] | None = None
    kind: Literal["models", "engine"] = "models"
    repository: dict[str, Any] | None = None


class HookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(max_length=2000)
    format: str = "json"


class CommitIn(BaseModel):
    sha: Sha
    branch: line(255) = "main"
    parents: list[Sha] = Field(default_factory=list, max_length=16)
    message: Text = ""
    author: line(255) = ""
    timestamp: datetime | None = None


class CiWebhook(CommitIn):
    project: ProjectName


LibraryName = Annotated[str, StringConstraints(min_length=1, max_length=32)]


class NearMissIn(BaseModel):
    """optimizer.report.NearMiss as its to_dict() writes it."""

    model_config = ConfigDict(extra="forbid")
    rule: Key
    anchor: line(400)
    step: line(200) = ""
    reason: line(1000, min_length=1)
    barrier: line(400) | None = None
    message: line(1500) | None = None


class RuleStatsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fired: Count = 0
    ms: ShareMs = 0.0


class KernelTimeIn(BaseModel):
    """One of a run's slowest kernels (service/adapters/engines/result.py's top_kernels)."""

    model_config = ConfigDict(extra="forbid")
    op: Key
    ms: ShareMs


class PairedBaselineIn(BaseModel):
    """The baseline timed in the same job as the result, alternately (issue 29's paired measurement):
    its commit and its samples, paired with the result's `execute_ms` by position (the i-th of each
    measured next to each other: block levels, A B B A …)."""

    model_config = ConfigDict(extra="forbid")
    commit: Sha
    execute_ms: list[Milliseconds] = Field(min_length=1, max_length=MAX_SAMPLES)


class ResultIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: ModelName
    engine: str = Field(pattern="^(" + "|".join(ENGINES) + ")$")
    engine_version: line(64, min_length=1)
    level: str = Field(pattern="^(" + "|".join(LEVEL_NAMES) + ")$")
    fusions: dict[Key, Count] = Field(max_length=2000)
    ops_after: dict[Key, Count] = Field(default_factory=dict, max_length=2000)
    nodes_before: Count | None = None
    nodes_after: Count | None = None
    graph_hash: str | None = Field(None, max_length=64, pattern="^[0-9A-Za-z]*$")
    near_misses: list[NearMissIn] = Field(default_factory=list, max_length=MAX_NEAR_MISSES)
    rules: dict[Key, RuleStatsIn] = Field(default_factory=dict, max_length=1000)
    execute_ms: list[Milliseconds] = Field(default_factory=list, max_length=MAX_SAMPLES)
    model_run_ms: list[Milliseconds] = Field(default_factory=list, max_length=MAX_SAMPLES)
    top_kernels: list[KernelTimeIn] = Field(default_factory=list, max_length=100)
    threads: Count = 0
    inputs: dict[Key, line(300)] = Field(default_factory=dict, max_length=1000)
    max_abs_error: Error | None = None
    max_rel_error: Error | None = None
    numeric_ok: bool | None = None
    peak_bytes: int | None = Field(None, ge=0, le=INT64_MAX)
    session_ms: Milliseconds | None = None
    canary_ms: Milliseconds | None = None  # service/adapters/canary.py, timed by the same job
    # Our engine's kernel library per family (runtime/kernel_choice.py), e.g. {"gemm": "onednn"}.
    kernel_libraries: dict[LibraryName, LibraryName] = Field(default_factory=dict, max_length=8)
    # The mark-all numeric check (service/schemas/numerics.py): per feed set, and the worst one's rows.
    numeric_checks: list[NumericCheckIn] = Field(default_factory=list, max_length=MAX_FEED_SETS)
    divergence: DivergenceIn | None = None
    baseline: PairedBaselineIn | None = None

    @model_validator(mode="after")
    def _paired_by_position(self) -> ResultIn:
        if self.baseline is not None and len(self.baseline.execute_ms) != len(self.execute_ms):
            raise ValueError(
                f"baseline.execute_ms has {len(self.baseline.execute_ms)} samples and execute_ms "
                f"{len(self.execute_ms)}: paired samples go by position, so both sides need as many")
        return self


class MachineIn(BaseModel):
    """service/adapters/machine.py's describe_machine(); fields it does not write are ignored."""

    machine_class: line(32, min_length=1) = "cpu"
    hostname: line(255) = ""
    cpu: line(255) = ""
    cores: Count = 0
    isa: list[line(32)] = Field(default_factory=list, max_length=64)
    gpu: line(255) = ""
    engine_versions: dict[line(64), line(64)] = Field(default_factory=dict, max_length=32)


class ResultsDocument(BaseModel):
    project: ProjectName
    commit: CommitIn
    machine: MachineIn | None = None
    results: list[ResultIn] = Field(min_length=1, max_length=1000)
