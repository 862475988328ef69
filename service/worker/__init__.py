"""Workers: the code that runs a job (execute.py), the embedded worker process `fusionwatch serve`
starts (embedded.py), and the Celery app for `fusionwatch worker` on other machines (celery_app.py)."""
