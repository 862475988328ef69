"""The stored model file a job's result will be compared with, when there is one to time beside it.

A job's baseline is the result `baselines.find_baseline` will pick once this job's result is stored:
the nearest measured ancestor with the same fingerprint. When that result was measured on a stored
file other than the job's own (a model repository's previous upload: the common case), the worker
times both in the same process (service/adapters/paired_measure.py). The same file is not paired: the
model did not change, and the unpaired path judges an engine's change of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from service.domain.measurement import Measurement, fingerprint
from service.models import Commit, Job, ModelFile, Result, Run
from service.usecases.baselines import find_baseline


@dataclass(frozen=True)
class BaselineFile:
    stored: tuple[str, str, list]  # (sha256, filename, data files) as the model store takes them
    commit_sha: str


def baseline_file(session: Session, job: Job, measurement: Measurement, machine_class: str) -> BaselineFile | None:
    run = session.get(Run, job.run_id)
    probe = Result(id=-1, project_id=run.project_id, commit_id=run.commit_id,
                   fingerprint=fingerprint(run.project_id, job.model_id, measurement, machine_class))
    baseline = find_baseline(session, probe)
    if baseline is None or baseline.model_file_id is None or baseline.model_file_id == job.model_file_id:
        return None
    file, own = session.get(ModelFile, baseline.model_file_id), session.get(ModelFile, job.model_file_id)
    if file is None or own is None or file.sha256 == own.sha256:
        return None
    commit = session.get(Commit, baseline.commit_id)
    return BaselineFile((file.sha256, file.filename, list(file.data_files)), commit.sha)
