"""A project's model repository: where a push's models come from. The project names a git URL and the
model paths (globs) in it; a push of commit X fetches exactly X into a bare mirror under the data dir
(`<data_dir>/repositories/<project id>.git`, `git fetch --depth=1 <url> <sha>`, no checkout), lists the
files at X matching the paths, checks each one's size before reading it, and hands back their bytes.

Everything a project names is hostile until checked. URLs: https://, ssh://, git@host:path, and file://
only where the server allows it (FUSIONWATCH_ALLOW_FILE_REPOSITORIES); git itself is told the same
(`protocol.allow`), so no other transport (ext::, a submodule's) is ever run. Paths: relative, no `..`.
Credentials: the name of a server environment variable under FUSIONWATCH_GIT_CREDENTIALS_, never a
value, so a project cannot have the server send any other secret to a URL it chose; the token goes to
git through GIT_CONFIG_* variables (never the command line, which `ps` shows). A Git LFS pointer is
refused by name: the bytes at X are a pointer, not the model.
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
from base64 import b64encode
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from service.errors import Invalid

CREDENTIALS_PREFIX = "FUSIONWATCH_GIT_CREDENTIALS_"
MAX_PATTERNS = 64
MAX_FILES = 64
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"
_SCP_LIKE = re.compile(r"git@[A-Za-z0-9.-]+:[A-Za-z0-9._~/-]+")
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_ENV_NAME = re.compile(re.escape(CREDENTIALS_PREFIX) + r"[A-Z0-9_]{1,64}")


class RepositoryError(Invalid):
    """The repository cannot give this commit's models; the message names the URL, the commit or the file."""


@dataclass(frozen=True)
class Repository:
    url: str
    models: list[str]
    credentials_env: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "models": list(self.models), "credentials_env": self.credentials_env}


def checked_repository(spec: dict[str, Any], allow_file: bool) -> Repository:
    """The project's `repository` as POST /projects gives it, or Invalid naming the field."""
    url = str(spec.get("url") or "").strip()
    if not _allowed_url(url, allow_file):
        schemes = "https://, ssh:// or git@host:path" + (", file://" if allow_file else "")
        raise Invalid(f"repository.url {url[:100]!r} must be a {schemes} URL without spaces or options")
    models = spec.get("models")
    if not isinstance(models, list) or not models or len(models) > MAX_PATTERNS:
        raise Invalid(f"repository.models must list 1 to {MAX_PATTERNS} paths or globs in the repository (models/*.onnx)")
    for pattern in models:
        if not isinstance(pattern, str) or not _safe_pattern(pattern):
            raise Invalid(f"repository.models: {str(pattern)[:100]!r} must be a relative path inside the repository "
                          "(no leading '/', no '..', no '\\\\')")
    credentials = spec.get("credentials_env")
    if credentials is not None and not (isinstance(credentials, str) and _ENV_NAME.fullmatch(credentials)):
        raise Invalid(f"repository.credentials_env must name a server environment variable starting with "
                      f"{CREDENTIALS_PREFIX} (holding a token for the URL), got {str(credentials)[:80]!r}")
    unknown = sorted(set(spec) - {"url", "models", "credentials_env"})
    if unknown:
        raise Invalid(f"repository: unknown field {unknown[0]!r}; it takes url, models and credentials_env")
    return Repository(url, list(models), credentials)


def fetch_models(repository: Repository, mirror: Path, sha: str, max_bytes: int, allow_file: bool,
                 timeout_s: float) -> list[tuple[str, bytes]]:
    """(path in the repository, bytes) of every file at `sha` matching the repository's model paths."""
    if not _SHA.fullmatch(sha):
        raise RepositoryError(f"commit {sha[:80]!r} is not a full sha; a push names its commit by its full sha")
    if not _allowed_url(repository.url, allow_file):
        raise RepositoryError(f"repository.url {repository.url[:100]!r} is not allowed on this server")
    git = _Git(mirror, repository, allow_file, timeout_s)
    if not mirror.exists():
        mirror.parent.mkdir(parents=True, exist_ok=True)
        git.run("init", "--quiet", "--bare", str(mirror), at_mirror=False)
    if git.run("cat-file", "-e", f"{sha}^{{commit}}", check=False).returncode != 0:
        fetched = git.run("fetch", "--quiet", "--depth=1", "--no-tags", "--no-recurse-submodules", "--", repository.url,
                          sha, check=False)
        if fetched.returncode != 0:
            raise RepositoryError(f"commit {sha[:12]} cannot be fetched from {repository.url}: {_last_line(fetched.stderr)} "
                                  "(a force-push or a deleted branch leaves a pushed commit unreachable)")
    listing = git.run("ls-tree", "-r", "-l", "-z", "--full-tree", sha).stdout
    entries = []
    for record in listing.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        mode, kind, blob, size = meta.split()
        name = path.decode("utf-8", "replace")
        if kind == b"blob" and not mode.startswith(b"120") and any(_matches(name, p) for p in repository.models):
            entries.append((name, blob.decode(), int(size)))
    if not entries:
        raise RepositoryError(f"no file at commit {sha[:12]} of {repository.url} matches repository.models "
                              f"{repository.models}")
    if len(entries) > MAX_FILES:
        raise RepositoryError(f"{len(entries)} files at commit {sha[:12]} match repository.models; at most {MAX_FILES}")
    total = sum(size for _, _, size in entries)
    for name, _, size in entries:
        if size > max_bytes or total > max_bytes:
            raise RepositoryError(f"{name} at commit {sha[:12]} is {size} bytes ({total} for all matched files); the "
                                  f"limit is {max_bytes} bytes (FUSIONWATCH_MAX_UPLOAD_MB)")
    files = []
    for name, blob, _ in entries:
        data = git.run("cat-file", "blob", blob).stdout
        if data.startswith(LFS_POINTER):
            raise RepositoryError(f"{name} at commit {sha[:12]} is a Git LFS pointer, not the model; fusionwatch does not "
                                  "fetch LFS objects: keep the .onnx out of LFS, or send it with `fusionwatch submit`")
        files.append((name, data))
    return files


class _Git:
    def __init__(self, mirror: Path, repository: Repository, allow_file: bool, timeout_s: float) -> None:
        self.mirror = mirror
        self.timeout_s = timeout_s
        config = [("protocol.allow", "never"), ("protocol.https.allow", "always"), ("protocol.ssh.allow", "always"),
                  ("protocol.file.allow", "always" if allow_file else "never"), ("core.hooksPath", "/dev/null"),
                  ("transfer.fsckObjects", "true")]
        if repository.credentials_env:
            token = os.environ.get(repository.credentials_env, "")
            if not token:
                raise RepositoryError(f"repository.credentials_env {repository.credentials_env} is not set on this server")
            basic = b64encode(f"x-access-token:{token}".encode()).decode()
            config.append(("http.extraHeader", f"Authorization: Basic {basic}"))
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(mirror.parent), "GIT_TERMINAL_PROMPT": "0",
                    "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_ASKPASS": "/bin/false",
                    "SSH_ASKPASS": "/bin/false", "GIT_SSH_COMMAND": "ssh -o BatchMode=yes",
                    "GIT_CONFIG_COUNT": str(len(config))}
        for index, (key, value) in enumerate(config):
            self.env[f"GIT_CONFIG_KEY_{index}"], self.env[f"GIT_CONFIG_VALUE_{index}"] = key, value

    def run(self, *args: str, check: bool = True, at_mirror: bool = True) -> subprocess.CompletedProcess:
        command = ["git", *(["--git-dir", str(self.mirror)] if at_mirror else []), *args]
        try:
            done = subprocess.run(command, env=self.env, capture_output=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired as error:
            raise RepositoryError(f"git {args[0]} took longer than {self.timeout_s:g} s (FUSIONWATCH_GIT_FETCH_TIMEOUT_S)") from error
        if check and done.returncode != 0:
            raise RepositoryError(f"git {args[0]} failed: {_last_line(done.stderr)}")
        return done


def _allowed_url(url: str, allow_file: bool) -> bool:
    if not url or len(url) > 2000 or any(c.isspace() or c in "\\\0" for c in url) or url.startswith("-"):
        return False
    if url.startswith(("https://", "ssh://")):
        # A host (or user) starting with '-' would reach ssh as an option (-oProxyCommand=...).
        authority = url.split("://", 1)[1].split("/", 1)[0]
        return "::" not in url and bool(authority) and not authority.startswith("-") and "@-" not in authority
    if url.startswith("file://"):
        return allow_file and ".." not in PurePosixPath(url.removeprefix("file://")).parts
    return bool(_SCP_LIKE.fullmatch(url)) and ".." not in url


def _safe_pattern(pattern: str) -> bool:
    if not pattern or len(pattern) > 300 or pattern.startswith("/") or "\\" in pattern or "\0" in pattern:
        return False
    return ".." not in PurePosixPath(pattern).parts


def _matches(path: str, pattern: str) -> bool:
    # fnmatch's * crosses '/'; a pattern's segments are matched one by one so models/*.onnx stays in models/.
    parts, wanted = path.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted, strict=True))


def _last_line(stderr: bytes) -> str:
    lines = [line for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"
