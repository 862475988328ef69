"""The service's use cases, one module each, called alike by the routes, the worker and the CLI.

Each function takes a SQLAlchemy session and leaves the transaction to its caller, so a route can
do several in one transaction and a failure leaves nothing half-written.
"""
