"""Request bodies the API accepts (JSON); multipart forms are declared on their routes."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from service.models.vocabulary import ENGINES, LEVEL_NAMES


class ProjectCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    webhook_secret: str | None = Field(None, max_length=200)
    settings: dict[str, Any] | None = None


class HookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(max_length=2000)
    format: str = "json"


class CommitIn(BaseModel):
    sha: str = Field(min_length=1, max_length=64)
    branch: str = Field("main", max_length=255)
    parents: list[str] = Field(default_factory=list, max_length=16)
    message: str = Field("", max_length=10_000)
    author: str = Field("", max_length=255)
    timestamp: datetime | None = None


class CiWebhook(CommitIn):
    project: str = Field(min_length=1, max_length=200)


LibraryName = Annotated[str, StringConstraints(min_length=1, max_length=32)]


class ResultIn(BaseModel):
    model: str = Field(min_length=1, max_length=255)
    engine: str = Field(pattern="^(" + "|".join(ENGINES) + ")$")
    engine_version: str = Field(min_length=1, max_length=64)
    level: str = Field(pattern="^(" + "|".join(LEVEL_NAMES) + ")$")
    fusions: dict[str, int]
    ops_after: dict[str, int] = Field(default_factory=dict)
    nodes_before: int | None = Field(None, ge=0)
    nodes_after: int | None = Field(None, ge=0)
    graph_hash: str | None = Field(None, max_length=64)
    near_misses: list[dict[str, Any]] = Field(default_factory=list)
    rules: dict[str, Any] = Field(default_factory=dict)
    execute_ms: list[float] = Field(default_factory=list)
    model_run_ms: list[float] = Field(default_factory=list)
    top_kernels: list[dict[str, Any]] = Field(default_factory=list)
    threads: int = Field(0, ge=0)
    inputs: dict[str, str] = Field(default_factory=dict)
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    numeric_ok: bool | None = None
    peak_bytes: int | None = None
    session_ms: float | None = None
    canary_ms: float | None = Field(None, gt=0)  # service/canary.py, timed by the same job
    # Our engine's kernel library per family (runtime/kernel_choice.py), e.g. {"gemm": "onednn"}.
    kernel_libraries: dict[LibraryName, LibraryName] = Field(default_factory=dict, max_length=8)


class ResultsDocument(BaseModel):
    project: str = Field(min_length=1, max_length=200)
    commit: CommitIn
    machine: dict[str, Any] | None = None
    results: list[ResultIn] = Field(min_length=1, max_length=1000)
