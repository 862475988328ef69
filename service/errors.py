"""The service's errors: each carries the HTTP status it maps to and a message naming the problem.

The use cases raise these; the app turns them into `{"detail": message}` replies and the CLI into
one error line, so a use case never imports FastAPI.
"""

from __future__ import annotations


class ServiceError(Exception):
    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(ServiceError):
    status = 404


class Invalid(ServiceError):
    status = 422


class TooLarge(ServiceError):
    status = 413


class Conflict(ServiceError):
    status = 409


class Unauthorized(ServiceError):
    status = 401


class Forbidden(ServiceError):
    status = 403
