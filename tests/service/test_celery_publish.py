"""A job's message published straight to Redis (service/adapters/celery_publish.py) is the one Celery's own
send_task makes: kombu reads both back alike, as the task with the job's id."""

from __future__ import annotations

import json
import os
import uuid

import pytest
import redis
from kombu import Connection, Exchange, Queue

from service.adapters.celery_publish import RUN_JOB, publish_run_job

REDIS_URL = os.environ.get("FUSIONWATCH_TEST_REDIS_URL")



@pytest.fixture
def queue_name():
    name = f"t{uuid.uuid4().hex[:12]}"
    yield name
    if REDIS_URL:
        redis.Redis.from_url(REDIS_URL).delete(name, f"_kombu.binding.{name}")


def _without_ids(envelope: dict) -> dict:
    envelope = json.loads(json.dumps(envelope))
    for key in ("id", "root_id", "argsrepr"):
        envelope["headers"].pop(key)
    for key in ("correlation_id", "delivery_tag", "reply_to"):
        envelope["properties"].pop(key)
    envelope.pop("body")
    return envelope


@pytest.mark.skipif(not REDIS_URL, reason="FUSIONWATCH_TEST_REDIS_URL is not set (CI sets it)")
def test_the_direct_message_is_celerys_own(queue_name):
    publish_run_job(REDIS_URL, queue_name, 7)  # the first for a queue goes through Celery, which declares it
    publish_run_job(REDIS_URL, queue_name, 8)  # then straight to Redis
    stored = [json.loads(raw) for raw in reversed(redis.Redis.from_url(REDIS_URL).lrange(queue_name, 0, -1))]
    assert len(stored) == 2
    by_celery, direct = stored
    assert _without_ids(direct) == _without_ids(by_celery)
    assert list(direct["headers"]) == list(by_celery["headers"])
    assert direct["headers"]["argsrepr"] == "[8]" and by_celery["headers"]["argsrepr"] == "[7]"
    assert direct["headers"]["id"] != by_celery["headers"]["id"]

    read = []
    with Connection(REDIS_URL) as connection:
        queue = Queue(queue_name, Exchange(queue_name), routing_key=queue_name)
        with connection.SimpleQueue(queue) as simple:
            for _ in range(2):
                message = simple.get(timeout=5)
                read.append((message.headers["task"], message.headers["id"], message.decode()))
                message.ack()
    assert [(task, body[0], body[1]) for task, _, body in read] == [(RUN_JOB, [7], {}), (RUN_JOB, [8], {})]
    assert read[1][1] == direct["headers"]["id"]


def test_other_brokers_go_through_celery(monkeypatch):
    sent = []

    class FakeCelery:
        def send_task(self, name, args, queue):
            sent.append((name, args, queue))

    monkeypatch.setattr("service.adapters.celery_publish.celery_app", lambda url: FakeCelery())
    for job_id in (1, 2):
        publish_run_job("amqp://guest@127.0.0.1//", "cpu", job_id)
    assert sent == [(RUN_JOB, [1], "cpu"), (RUN_JOB, [2], "cpu")]
