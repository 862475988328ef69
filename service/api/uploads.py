"""Read multipart uploads with the size limit enforced while reading, not after."""

from __future__ import annotations

from fastapi import UploadFile

from service.errors import TooLarge

CHUNK = 1024 * 1024


def read_uploads(files: list[UploadFile], max_bytes: int) -> list[tuple[str, bytes]]:
    out, total = [], 0
    for upload in files:
        chunks = []
        while chunk := upload.file.read(CHUNK):
            total += len(chunk)
            if total > max_bytes:
                raise TooLarge(
                    f"upload is over the limit of {max_bytes} bytes (FUSIONWATCH_MAX_UPLOAD_MB) at file "
                    f"{(upload.filename or '?')[:80]!r}"
                )
            chunks.append(chunk)
        out.append((upload.filename or "model.onnx", b"".join(chunks)))
    return out
