"""The steps commands (service/commands/) and queries (service/queries/) are made of: recording a commit,
a run or a result, finding a baseline, raising alerts, rendering history points.

Each function takes a SQLAlchemy session and leaves the transaction to its caller, so a command can do
several in one transaction and a failure leaves nothing half-written; the command commits and then runs
what must follow a commit (announcing jobs, delivering alerts, placing change-point windows).
"""
