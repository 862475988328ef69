"""Request bodies bounded before they are read whole, and JSON bounded before it is parsed.

`BodyLimit` (ASGI middleware) refuses a body over its route's limit with 413: at once when its
Content-Length says so, else as soon as the bytes streamed in pass the limit, so a 100 MB body never
sits in the server's memory. Limits: the GitHub hook 5 MB (a push of 2,048 commits is under 2 MB),
POST /results 8 MB, a multipart upload the upload limit (FUSIONWATCH_MAX_UPLOAD_MB) plus 1 MB of form,
any other body 1 MB.

`parse_json` then counts a body's values before parsing it (every ',', '[' and '{', inside strings
too, so an over-estimate): a few megabytes of `[],[],...` would otherwise become millions of Python
objects, hundreds of megabytes. Nesting is bounded by the count and by orjson's parser (1,024 deep,
without recursing in Python), so a document 200,000 deep is refused, not a RecursionError.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import tempfile
from typing import Any

import orjson
from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import Invalid

MB = 1024**2
MAX_GITHUB_BODY = 5 * MB
MAX_RESULTS_BODY = 8 * MB
MAX_FORM_BODY = 1 * MB  # beside a multipart upload's files
MAX_OTHER_BODY = 1 * MB
MAX_JSON_VALUES = 500_000  # at most ~32 MB of Python objects, however they nest
_LIMITED_PATHS = {"/api/v1/webhooks/github": MAX_GITHUB_BODY, "/api/v1/results": MAX_RESULTS_BODY}
_READS_NO_BODY = frozenset({"GET", "HEAD", "OPTIONS"})


class BodyLimit:
    def __init__(self, app: ASGIApp, max_upload_bytes: int) -> None:
        self.app = app
        self.max_upload_bytes = max_upload_bytes

    def limit_for(self, scope: Scope) -> int:
        limit = _LIMITED_PATHS.get(scope["path"].rstrip("/"))
        if limit is not None:
            return limit
        content_type = _header(scope, b"content-type") or ""
        return self.max_upload_bytes + MAX_FORM_BODY if content_type.startswith("multipart/") else MAX_OTHER_BODY

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in _READS_NO_BODY:
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope)
        # An upload's limit is a setting; say which, as the upload's own check does (api/uploads.py).
        setting = " (FUSIONWATCH_MAX_UPLOAD_MB)" if limit == self.max_upload_bytes + MAX_FORM_BODY else ""
        declared = _header(scope, b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            problem = ("Content-Length is not a number" if not declared.isdigit()
                       else f"request body is {int(declared)} bytes; at most {limit} here{setting}")
            await JSONResponse({"detail": problem}, status_code=400 if not declared.isdigit() else 413,
                               headers={"Connection": "close"})(scope, receive, send)
            return
        received = 0

        async def bounded_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # An HTTPException passes through FastAPI's body reading (other errors there become 400s).
                    raise HTTPException(413, f"request body is over {limit} bytes; at most {limit} here{setting}",
                                        headers={"Connection": "close"})
            return message

        await self.app(scope, bounded_receive, send)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def parse_json(body: bytes | str, what: str, max_values: int = MAX_JSON_VALUES) -> Any:
    """The JSON document `body`, refused with 422 naming `what` when it is not JSON or holds too many values."""
    data = body.encode() if isinstance(body, str) else body
    values = data.count(b",") + data.count(b"[") + data.count(b"{")
    if values > max_values:
        raise Invalid(f"{what}: more than {max_values} JSON values")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as error:
        if b"NaN" in data or b"Infinity" in data:
            return _with_non_finite_numbers(data, what, error)
        raise Invalid(f"{what} is not JSON ({str(error)[:120]})") from error


def _with_non_finite_numbers(data: bytes, what: str, error: Exception) -> Any:
    """Python's json module writes NaN and Infinity, which are not JSON: read them, so that the schema
    names the field holding one (a finite number is wanted there) instead of a character position."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise Invalid(f"{what} is not JSON ({str(error)[:120]})") from error


def json_document(schema: type[BaseModel], what: str):
    """A dependency: the request's JSON body parsed with `parse_json` and validated as `schema`, its
    errors reported as FastAPI reports a body's (a 422 naming the field)."""

    async def read(request: Request) -> BaseModel:
        data = parse_json(await request.body(), what)
        try:
            return schema.model_validate(data)
        except ValidationError as error:
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in error.errors()[:5]]) from None

    return read


class SpooledBody:
    """A signed body spooled to a temporary file as it streams in (a megabyte of it in memory at most):
    its signature covers all of it, so it is read whole before the sender is known, and a multipart
    upload of a gigabyte with a wrong signature must not sit in memory to be refused."""

    CHUNK = 1024 * 1024

    def __init__(self) -> None:
        self.file = tempfile.SpooledTemporaryFile(max_size=MB)

    @classmethod
    async def read(cls, request: Request) -> SpooledBody:
        spooled = cls()
        async for chunk in request.stream():  # bounded by BodyLimit as it arrives
            spooled.file.write(chunk)
        return spooled

    def signature(self, key: bytes) -> bytes:
        """The hex HMAC-SHA256 of the body with `key`, as GitHub's X-Hub-Signature-256 carries it."""
        digest = hmac.new(key, digestmod=hashlib.sha256)
        self.file.seek(0)
        while chunk := self.file.read(self.CHUNK):
            digest.update(chunk)
        return digest.hexdigest().encode()

    def whole(self) -> bytes:
        self.file.seek(0)
        return self.file.read()

    def replayed(self, request: Request) -> Request:
        """`request` reading its body from the spool (for the form parser)."""
        self.file.seek(0)

        async def receive() -> Message:
            chunk = self.file.read(self.CHUNK)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunk)}

        return Request(request.scope, receive)
