"""Re-measure a commit whose timing alert is only suspected: one more job for the same model file,
engine and level, queued at once.

A suspected alert is confirmed by a second measurement that agrees (`timing_alerts.py`). Waiting for
the next commit delays every real step by a commit (and a branch may never get one); one extra job
per suspected alert settles it within the same CI round, and costs little because suspicions are
rare (`make bench-detect` counts them). The job goes in a run of its own (trigger `remeasure`): a
run holds one job per model × engine × level. The commit's runs stay `running` until it is done, so
a CI step waiting on its run gets the settled verdict. Its result is recorded like any other; the alerting
code sees a second result of an alerted commit and confirms or leaves the alert (never raising a
second one). A re-measurement that leaves the alert suspected but came out nearer the alerted job's
level than the window's asks for one more, up to `TimingPolicy.remeasures` in all
(`timing_alerts.measure_again`): its reply lists the alert, still suspected, and it is queued here the
same way.

Results posted from elsewhere (client mode) have no job to repeat: the client re-measures what its
reply marks `suspected` and posts that commit again.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from service.models import Alert, Job, Result, Run
from service.usecases.runs import REMEASURE_TRIGGER
from service.usecases.timing_alerts import KIND


def remeasure_job(session: Session, result: Result, alerts: Sequence[Alert]) -> Job | None:
    """The re-measurement job for `result` when one of `alerts` is a suspected timing regression (newly
    raised, or asking for one more re-measurement) and the result came from a job; None otherwise. Dispatch it after the transaction commits."""
    if result.job_id is None or not any(a.kind == KIND and a.state == "suspected" for a in alerts):
        return None
    measured = session.get(Job, result.job_id)
    run = Run(project_id=result.project_id, commit_id=result.commit_id, trigger=REMEASURE_TRIGGER, state="running")
    session.add(run)
    session.flush()
    job = Job(
        run_id=run.id,
        model_id=measured.model_id,
        model_file_id=measured.model_file_id,
        engine=measured.engine,
        level=measured.level,
        machine_class=measured.machine_class,
    )
    session.add(job)
    session.flush()
    return job
