"""How a project's models are measured: which engines and levels, how many runs, on what inputs.

A project's `settings` override these defaults field by field; `POST /projects` validates them here,
so a stored project always has a protocol the worker can follow.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.domain.tolerances import ATOL_ROUNDOFFS, RTOL_ROUNDOFFS, Tolerances
from service.domain.vocabulary import ENGINES, LEVEL_NAMES


class Protocol(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    engines: list[str] = Field(default_factory=lambda: list(ENGINES))
    levels: list[str] = Field(default_factory=lambda: list(LEVEL_NAMES))
    warmup: int = Field(3, ge=0, le=100)
    # 100: timing alerts judge each job by its fastest runs (service/domain/timing.py); with 30 runs a
    # busy moment of a shared machine moved that end in 3 jobs out of 100, with 100 runs almost never.
    runs: int = Field(100, ge=1, le=10_000)
    # Fixed so timings compare across commits; 1 keeps two jobs on one machine from fighting.
    threads: int = Field(1, ge=0, le=256)
    # Values for symbolic input dimensions other than the batch (engines/feeds.py).
    sequence_length: int = Field(128, ge=1, le=65536)
    # The numeric check of every level against `disabled`, for float32/float64 tensors (fp32 defaults of
    # the project's tests).
    rtol: float = Field(1e-3, ge=0)
    atol: float = Field(1e-4, ge=0)
    # For float16/bfloat16 (and float8) tensors, in units of the type's unit roundoff u (float16 2^-11,
    # bfloat16 2^-8) per square root of the reductions d the tensor is computed through:
    # |got - ref| <= sqrt(d)·(rtol_16bit_roundoffs·u·|ref| + atol_16bit_roundoffs·u·max|ref|)
    # (service/domain/tolerances.py says why the absolute term scales with the tensor and the bound with
    # sqrt(d)). At most 256: bfloat16's 256 u is 100%, no comparison at all.
    rtol_16bit_roundoffs: float = Field(RTOL_ROUNDOFFS, ge=0, le=256, allow_inf_nan=False)
    atol_16bit_roundoffs: float = Field(ATOL_ROUNDOFFS, ge=0, le=256, allow_inf_nan=False)
    # timing-regression: the least rise that counts, however quiet the series (service/domain/timing.py
    # raises the bar to 3× the series' own job-to-job noise); 5 so that 10% steps clear it.
    timing_threshold_pct: float = Field(5.0, gt=0)
    # A job whose model's baseline file is stored also times the baseline and the candidate in the same
    # process, alternately (service/domain/paired.py), deciding on their paired ratios; at most this
    # many seconds of machine time per job on it (0: never paired).
    paired_max_seconds: float = Field(60.0, ge=0, le=3600)
    # Raw timing samples are kept for the latest this-many commits of each series (None: all); older results
    # keep their statistics (service/usecases/retention.py). The least, 100, is what the timing alerts read
    # (retention.MIN_KEEP_COMMITS).
    keep_samples_commits: int | None = Field(None, ge=100, le=1_000_000)

    def tolerances(self) -> Tolerances:
        return Tolerances(self.rtol, self.atol, self.rtol_16bit_roundoffs, self.atol_16bit_roundoffs)

    @field_validator("engines")
    @classmethod
    def _known_engines(cls, value: list[str]) -> list[str]:
        return _subset(value, ENGINES, "engines")

    @field_validator("levels")
    @classmethod
    def _known_levels(cls, value: list[str]) -> list[str]:
        return _subset(value, LEVEL_NAMES, "levels")


def _subset(value: list[str], allowed: tuple[str, ...], label: str) -> list[str]:
    if not value or any(item not in allowed for item in value):
        raise ValueError(f"{label} must be a non-empty subset of {list(allowed)}, got {value}")
    return list(dict.fromkeys(value))


def protocol_for(settings: dict[str, Any] | None) -> Protocol:
    return Protocol(**(settings or {}))
