"""What the service talks to: the database (db.py, migrate.py), the model store (storage.py), the job
queue and its broker (queue.py, celery_publish.py), the engines a model is measured with (engines/,
measure.py, canary.py) and the machine it runs on (machine.py). Nothing here decides what a result means."""
