"""The numeric check's records as POST /results takes them: per feed set, and the worst comparison's
rows (service/adapters/engines/numerics.py writes them; service/adapters/engines/compare.py says what each field is).

An infinite error (shapes that differ) is stored as the string "inf", since JSON has no Infinity.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from service.schemas.fields import Count, Error, Key, line

StoredError = Error | Literal["inf"]
Status = Literal["compared", "too-large", "unavailable"]
MAX_ROWS = 64
MAX_FEED_SETS = 64
MAX_FAILED_OUTPUTS = 4  # service/adapters/engines/compare.py keeps no more


class DivergenceRowIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tensor: Key
    reference_node: line(300)
    reference_op: Key
    node: line(300)
    op: Key
    rule: Key | None = None
    fused_op: Key | None = None
    max_abs: StoredError
    max_rel: StoredError
    nonfinite: line(16) | None = None
    diverges: bool
    problem: line(300) | None = None
    tolerance: line(300) | None = None  # "float16: atol … × max|ref| + rtol … × |ref|"


class DivergenceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    feed_set: line(100, min_length=1)
    status: Status
    reason: line(1000) | None = None
    tensors: Count = 0
    diverging: Count = 0
    first: DivergenceRowIn | None = None
    outputs_max_abs: StoredError = 0.0
    outputs_max_rel: StoredError = 0.0
    outputs_ok: bool = True
    # "output 'logits' (float16: atol … + rtol … × |ref|): max abs err …", the first few out of tolerance
    failed_outputs: list[line(500)] = Field(default_factory=list, max_length=MAX_FAILED_OUTPUTS)
    new_nonfinite: bool = False
    rows: list[DivergenceRowIn] = Field(default_factory=list, max_length=MAX_ROWS)


class NumericCheckIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    feed_set: line(100, min_length=1)
    inputs: dict[Key, line(300)] = Field(default_factory=dict, max_length=1000)
    status: Status
    ok: bool
    tensors: Count = 0
    diverging: Count = 0
    max_abs: StoredError = 0.0
    max_rel: StoredError = 0.0
    first: Key | None = None
    failed_outputs: list[line(500)] = Field(default_factory=list, max_length=MAX_FAILED_OUTPUTS)
    reason: line(1000) | None = None  # why a feed set was not checked (it no longer fits the model)
