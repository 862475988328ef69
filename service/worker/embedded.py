"""The embedded worker: one process, spawned next to the API by `fusionwatch serve`, running jobs one
at a time so timings are not disturbed by each other.

Spawned, not forked: oneDNN's GNU OpenMP runtime hangs in a forked child. The API process keeps a
supervisor thread that restarts the worker when it dies (a model that crashes the interpreter takes
only this process down) and kills it when a job runs past the timeout; either way the job goes back
to the queue while attempts remain (service/adapters/queue.py).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading

from sqlalchemy.exc import OperationalError

from service.adapters.db import DatabaseOutage, make_engine
from service.adapters.engines.custom_ops import load_custom_ops
from service.adapters.machine import limit_address_space
from service.commands.claim_next_job import claim_next_job
from service.commands.execute_job import execute_job
from service.commands.release_jobs import release_jobs
from service.core.config import Settings
from service.core.limits import UploadLimits
from service.core.logging import configure_logging
from service.queries.jobs import running_longer_than
from service.services import Services, worker_services

log = logging.getLogger("fusionwatch.worker")


def worker_main(config: Settings, database_url: str, limits: UploadLimits) -> None:
    """The worker process's loop. SIGTERM lets the current job finish, then exits."""
    configure_logging(config.log_level)
    limit_address_space(config.job_memory_mb)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    engine = make_engine(database_url)
    services = worker_services(engine, config, limits, load_custom_ops(config.custom_ops))
    name = worker_name()
    outage = DatabaseOutage(log)
    while not stopping.is_set():
        try:
            job_id = claim_next_job(services, name)
        except OperationalError as error:
            stopping.wait(outage.wait_after(error))
            continue
        outage.over()
        if job_id is None:
            stopping.wait(config.poll_interval_s)
            continue
        execute_job(services, job_id)
    engine.dispose()


def worker_name() -> str:
    return f"embedded-{os.getpid()}"


class EmbeddedWorker:
    """Starts, watches and stops the worker process from inside the API process."""

    def __init__(self, services: Services, database_url: str) -> None:
        """`services`: the app's; the worker process builds its own on `database_url` from their settings."""
        config = services.settings
        self._args = (config, database_url, services.upload_limits)
        self._timeout = config.job_timeout_s
        self._max_attempts = config.max_attempts
        self._services = services
        self._context = multiprocessing.get_context("spawn")
        self._process: multiprocessing.process.BaseProcess | None = None
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._supervise, name="fusionwatch-worker-supervisor", daemon=True)

    def start(self) -> None:
        # Jobs an earlier serve left running belong to no live worker now.
        release_jobs(self._services, self._max_attempts, why="the service restarted while it ran")
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
        return running_longer_than(self._services, name, self._timeout)

    def _release(self, name: str, why: str) -> None:
        release_jobs(self._services, self._max_attempts, worker=name, why=why)

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
