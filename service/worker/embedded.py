"""The embedded worker: one process, spawned next to the API by `fusionwatch serve`, running jobs one
at a time so timings are not disturbed by each other.

Spawned, not forked: oneDNN's GNU OpenMP runtime hangs in a forked child. The API process keeps a
supervisor thread that restarts the worker when it dies (a model that crashes the interpreter takes
only this process down) and kills it when a job runs past the timeout; either way the job goes back
to the queue while attempts remain (service/queue.py).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from optimizer import LoadLimits
from service import queue
from service.alerts.delivery import deliver
from service.core.logging import configure_logging
from service.db import DatabaseOutage, make_engine, make_session_factory
from service.engines.custom_ops import load_custom_ops
from service.machine import describe_machine, limit_address_space
from service.models import Job
from service.models.base import utc_now
from service.storage import ModelStore
from service.worker.execute import execute_job

log = logging.getLogger("fusionwatch.worker")


def worker_main(
    database_url: str, data_dir: str, machine_class: str, limits: LoadLimits, poll_s: float, log_level: str,
    custom_ops: str = "",
    memory_mb: int = 0,
) -> None:
    """The worker process's loop. SIGTERM lets the current job finish, then exits."""
    configure_logging(log_level)
    limit_address_space(memory_mb)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    engine = make_engine(database_url)
    session_factory = make_session_factory(engine)
    store = ModelStore(Path(data_dir))
    name = worker_name()
    machine = describe_machine(machine_class)
    kernels = load_custom_ops(custom_ops)
    outage = DatabaseOutage(log)
    while not stopping.is_set():
        try:
            with session_factory() as session:
                job = queue.claim_next(session, name, machine_class)
                job_id = None if job is None else job.id
        except OperationalError as error:
            stopping.wait(outage.wait_after(error))
            continue
        outage.over()
        if job_id is None:
            stopping.wait(poll_s)
            continue
        execute_job(session_factory, job_id, store, limits, machine, kernels)
    engine.dispose()


def worker_name() -> str:
    return f"embedded-{os.getpid()}"


class EmbeddedWorker:
    """Starts, watches and stops the worker process from inside the API process."""

    def __init__(
        self,
        database_url: str,
        data_dir: Path,
        machine_class: str,
        limits: LoadLimits,
        job_timeout_s: float,
        max_attempts: int,
        poll_s: float = 0.5,
        log_level: str = "WARNING",
        custom_ops: str = "",
        memory_mb: int = 0,
    ) -> None:
        self._args = (database_url, str(data_dir), machine_class, limits, poll_s, log_level, custom_ops, memory_mb)
        self._timeout = job_timeout_s
        self._max_attempts = max_attempts
        self._session_factory = make_session_factory(make_engine(database_url))
        self._context = multiprocessing.get_context("spawn")
        self._process: multiprocessing.process.BaseProcess | None = None
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._supervise, name="fusionwatch-worker-supervisor", daemon=True)

    def start(self) -> None:
        with self._session_factory() as session:
            # Jobs an earlier serve left running belong to no live worker now.
            queue.release_abandoned(session, self._max_attempts, why="the service restarted while it ran")
        self._spawn()
        self._watch.start()

    def _spawn(self) -> None:
        self._process = self._context.Process(target=worker_main, args=self._args, name="fusionwatch-worker", daemon=True)
        self._process.start()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def _supervise(self) -> None:
        outage = DatabaseOutage(log)
        while not self._stop.wait(0.5):
            try:
                self._look_after_the_worker()
            except OperationalError as error:  # the database is away; look again once it may be back
                self._stop.wait(outage.wait_after(error))
            else:
                outage.over()

    def _look_after_the_worker(self) -> None:
        process = self._process
        name = f"embedded-{process.pid}"
        if not process.is_alive():
            if self._stop.is_set():
                return
            self._release(name, f"the worker process exited with code {process.exitcode} while running it")
            self._spawn()
        elif self._job_overdue(name):
            process.kill()
            process.join(10)
            self._release(name, f"it ran past the {self._timeout:g} s job timeout and was killed")
            self._spawn()

    def _job_overdue(self, name: str) -> bool:
        with self._session_factory() as session:
            return session.scalar(
                select(Job.id).where(
                    Job.state == "running",
                    Job.worker == name,
                    Job.started_at < utc_now() - timedelta(seconds=self._timeout),
                )
            ) is not None

    def _release(self, name: str, why: str) -> None:
        with self._session_factory() as session:
            alerts = queue.release_abandoned(session, self._max_attempts, worker=name, why=why)
        deliver(self._session_factory, alerts)

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._watch.is_alive():
            self._watch.join(5)
        process = self._process
        if process is not None and process.is_alive():
            process.terminate()  # SIGTERM: the current job finishes first
            process.join(timeout_s)
            if process.is_alive():
                process.kill()
                process.join(5)
                self._release(f"embedded-{process.pid}", "the service stopped while it ran")
