"""Uploaded model files, content-addressed under the data directory, each in a directory of its own.

    <data_dir>/models/<sha256>/<model>.onnx        the graph
    <data_dir>/models/<sha256>/<weights files>     external data that came in the same upload

The sha256 covers the .onnx and its external-data files (names and bytes), so the same upload is the
same directory. A directory is written under a temporary name and renamed into place, so a reader
never sees half a model, and the loader (optimizer/model_io.py) only ever reads inside it.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import re
import shutil
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from optimizer.text import shorten
from service.errors import Invalid, TooLarge

# Names stay plain: no directories, no hidden files, nothing a shell or a path join reads twice.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$")
MAX_FILES = 64


@dataclass(frozen=True)
class StoredModel:
    sha256: str
    directory: Path
    filename: str  # the .onnx
    data_files: tuple[str, ...]
    size_bytes: int

    @property
    def path(self) -> Path:
        return self.directory / self.filename


def safe_filename(name: str) -> str:
    base = os.path.basename(name.replace("\\", "/"))
    if not _SAFE_NAME.match(base):
        raise Invalid(
            f"file name {base[:60]!r} is not allowed: letters, digits, '.', '_', '+', '-' only, "
            "at most 200 characters, not starting with '.'"
        )
    return base


def unpack_upload(files: list[tuple[str, bytes]], max_bytes: int) -> tuple[str, dict[str, bytes]]:
    """(the .onnx's name, {name: bytes}) from uploaded files: .onnx plus data files, or one .zip."""
    if len(files) == 1 and files[0][0].lower().endswith(".zip"):
        files = _unzip(files[0], max_bytes)
    if len(files) > MAX_FILES:
        raise Invalid(f"{len(files)} files in one upload; at most {MAX_FILES}")
    named: dict[str, bytes] = {}
    for name, data in files:
        safe = safe_filename(name)
        if safe in named:
            raise Invalid(f"file {safe!r} appears twice in the upload")
        named[safe] = data
    total = sum(len(d) for d in named.values())
    if total > max_bytes:
        raise TooLarge(f"upload is {total} bytes, over the limit of {max_bytes} (FUSIONWATCH_MAX_UPLOAD_MB)")
    models = [n for n in named if n.lower().endswith(".onnx")]
    if len(models) != 1:
        raise Invalid(f"an upload holds exactly one .onnx file (its external data may come beside it); got {models or 'none'}")
    return models[0], named


def _unzip(upload: tuple[str, bytes], max_bytes: int) -> list[tuple[str, bytes]]:
    name, data = upload
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as error:
        raise Invalid(f"{safe_filename(name)}: not a zip archive ({error})") from error
    members = [m for m in archive.infolist() if not m.is_dir()]
    if len(members) > MAX_FILES:
        raise Invalid(f"{name}: {len(members)} files in the archive; at most {MAX_FILES}")
    declared = sum(m.file_size for m in members)
    if declared > max_bytes:  # checked before inflating: a zip bomb declares its size honestly or fails below
        raise TooLarge(f"{name}: unpacks to {declared} bytes, over the limit of {max_bytes}")
    out = []
    for member in members:
        if "/" in member.filename.strip("/") or member.filename.startswith(("/", "\\")) or ".." in member.filename:
            raise Invalid(f"{name}: member {member.filename[:80]!r} is in a folder; the archive must be flat")
        out.append((member.filename, _read_member(archive, member, name)))
    return out


# Python's zipfile inflates these; anything else (method 99 is WinZip's AES) raises NotImplementedError.
_READABLE_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2",
                     zipfile.ZIP_LZMA: "lzma"}


def _read_member(archive: zipfile.ZipFile, member: zipfile.ZipInfo, name: str) -> bytes:
    """The member's bytes, read no further than it declares; a member the archive cannot give back
    whole and intact (encrypted, an unknown method, a broken local header, a bad CRC, sizes that lie)
    is refused naming it."""
    which = f"{name}: member {member.filename[:80]!r}"
    if member.flag_bits & 0x1:
        raise Invalid(f"{which} is encrypted; upload an archive without a password")
    if member.compress_type not in _READABLE_METHODS:
        raise Invalid(f"{which} uses compression method {member.compress_type}; "
                      f"use one of {', '.join(_READABLE_METHODS.values())}")
    try:
        with archive.open(member) as handle:
            content = handle.read(member.file_size + 1)
    # zipfile's own errors for a damaged member, and those of the decompressors behind it.
    except (zipfile.BadZipFile, zlib.error, lzma.LZMAError, OSError, EOFError, ValueError) as error:
        raise Invalid(f"{which} cannot be read ({shorten(str(error), 120)})") from error
    if len(content) != member.file_size:
        raise Invalid(f"{which} is not the size it declares")
    return content


def content_digest(model_name: str, files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    digest.update(hashlib.sha256(files[model_name]).digest())
    for name in sorted(n for n in files if n != model_name):
        digest.update(b"\0" + name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return digest.hexdigest()


class ModelStore:
    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir) / "models"

    def shown(self, text: str) -> str:
        """`text` (a job's error) with paths under the data directory written relative to it: a reader
        of GET /runs learns the model's file, not where the server keeps its data."""
        data_dir = self.root.parent
        for prefix in dict.fromkeys((str(data_dir), str(data_dir.resolve()))):
            text = text.replace(prefix + os.sep, "")
        return text

    def directory(self, sha256: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise ValueError(f"not a sha256 digest: {sha256[:80]!r}")
        return self.root / sha256

    def put(self, model_name: str, files: dict[str, bytes]) -> StoredModel:
        sha256 = content_digest(model_name, files)
        final = self.directory(sha256)
        if not final.is_dir():
            self.root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".incoming-", dir=self.root))
            try:
                for name, data in files.items():
                    (staging / name).write_bytes(data)
                os.rename(staging, final)
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)
                if not final.is_dir():  # a concurrent upload of the same bytes won the rename
                    raise
        data_files = tuple(sorted(n for n in files if n != model_name))
        return StoredModel(sha256, final, model_name, data_files, sum(len(d) for d in files.values()))

    def get(self, sha256: str, filename: str, data_files: list[str] | tuple[str, ...] = ()) -> StoredModel:
        directory = self.directory(sha256)
        path = directory / safe_filename(filename)
        if not path.is_file():
            raise FileNotFoundError(f"stored model {sha256[:12]}/{filename} is missing from {self.root}")
        size = sum((directory / n).stat().st_size for n in (filename, *data_files))
        return StoredModel(sha256, directory, filename, tuple(data_files), size)
