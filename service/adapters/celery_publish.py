"""Tell Celery workers about a job: the message Celery's `send_task` would send, LPUSHed to Redis.

Every webhook publishes one message per job, and kombu's per-call machinery (a producer from the
pool, `ensure`, a channel, the encoders) took about a tenth of the webhook's CPU time for what is,
on Redis, one LPUSH of a small JSON document. So the first message for a queue in a process goes
through `send_task` (kombu declares the queue and its binding as it always does), and later ones
are that same document (Celery's task protocol 2, kombu's Redis envelope: the base64 body, the
task's headers and the delivery properties) with a fresh task id, on one Redis client per broker.
Brokers other than redis:// and rediss:// (and messages to other tasks) always go through Celery.
"""

from __future__ import annotations

import base64
import os
import socket
import threading
import uuid
from functools import cache

import orjson
import redis
from celery import Celery

RUN_JOB = "fusionwatch.run_job"
_DIRECT_SCHEMES = ("redis://", "rediss://")

_declared: set[tuple[str, str]] = set()  # (broker, queue) sent through Celery once in this process
_declared_lock = threading.Lock()


@cache
def celery_app(broker_url: str) -> Celery:
    """The process's Celery app for a broker, configured as the workers need (service/worker/celery_app.py
    registers the task on it); publishing needs only its connection."""
    app = Celery("fusionwatch", broker=broker_url)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,  # one job at a time per process: timings stay clean
        task_default_queue="cpu",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    return app


def publish_run_job(broker_url: str, queue: str, job_id: int) -> None:
    """Ask a worker listening on `queue` to run job `job_id` (service/worker/celery_app.py runs it)."""
    if not broker_url.startswith(_DIRECT_SCHEMES) or (broker_url, queue) not in _declared:
        celery_app(broker_url).send_task(RUN_JOB, args=[job_id], queue=queue)
        if broker_url.startswith(_DIRECT_SCHEMES):
            with _declared_lock:
                _declared.add((broker_url, queue))
        return
    _redis(broker_url).lpush(queue, run_job_message(queue, job_id))


def run_job_message(queue: str, job_id: int) -> bytes:
    """The envelope kombu's Redis transport stores for `send_task(RUN_JOB, args=[job_id], queue=queue)`."""
    task_id = str(uuid.uuid4())
    origin, reply_to = _sender(os.getpid())
    # Celery's body is [args, kwargs, embed], JSON with ", " and ": " separators, base64 in the envelope.
    body = f'[[{int(job_id)}], {{}}, {{"callbacks": null, "errbacks": null, "chain": null, "chord": null}}]'
    return orjson.dumps({
        "body": base64.b64encode(body.encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py", "task": RUN_JOB, "id": task_id, "shadow": None, "eta": None, "expires": None,
            "group": None, "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": task_id,
            "parent_id": None, "argsrepr": f"[{int(job_id)}]", "kwargsrepr": "{}", "origin": origin,
            "ignore_result": None, "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {},
        },
        "properties": {
            "correlation_id": task_id, "reply_to": reply_to, "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue}, "priority": 0, "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    })


@cache
def _redis(broker_url: str) -> redis.Redis:
    return redis.Redis.from_url(broker_url)


@cache
def _sender(pid: int) -> tuple[str, str]:
    """The message's origin and reply_to as Celery writes them for this process (results are never
    read back: there is no result backend)."""
    return f"gen{pid}@{socket.gethostname()}", str(uuid.uuid3(uuid.NAMESPACE_OID, f"{uuid.getnode()}-{pid}"))
