"""Workers: the embedded worker process `fusionwatch serve` starts (embedded.py) and the Celery app for
`fusionwatch worker` on other machines (celery_app.py); both run a job with service/commands/execute_job.py."""
