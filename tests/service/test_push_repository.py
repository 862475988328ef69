"""Pushes fetch the commit's models from the project's repository (a real local bare repository over
file://): a signed push raises the fusion-regression at the pushed commit from the file at that commit; the
same push to a project with no repository gets 422 and starts no run; an engine project measures its
registered models. Refused by name: a commit a force-push or a deleted branch left unreachable, no file at
that commit, a file over the size limit, a Git LFS pointer; refused at creation: a path outside the
repository and hostile URLs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import onnx
import pytest
from sqlalchemy import func, select

from service.adapters.model_repository import checked_repository
from service.core.config import Settings
from service.models import Alert, Commit, Run
from tests.service.custom_op_plugin import insert_before_gelu
from tests.service.github_deliveries import SECRET, deliver_push, signed
from tests.service.jobs import drain

BERT = Path(__file__).resolve().parents[1] / "models/bert_torchscript_opset14.onnx"
PLUGIN = "tests.service.custom_op_plugin"
SETTINGS = {"levels": ["extended"], "engines": ["fusionwatch"], "runs": 1, "warmup": 0, "sequence_length": 8}
GIT = {"GIT_AUTHOR_NAME": "Ada", "GIT_AUTHOR_EMAIL": "ada@example.com", "GIT_COMMITTER_NAME": "Ada",
       "GIT_COMMITTER_EMAIL": "ada@example.com", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}


@pytest.fixture
def service_settings(tmp_path) -> Settings:
    return Settings(data_dir=tmp_path / "data", allow_file_repositories=True, max_upload_mb=1)


class ModelRepository:
    """A working clone that commits and pushes to a bare repository, as a model repository's CI would."""

    def __init__(self, root: Path) -> None:
        self.bare, self.work = root / "models.git", root / "work"
        self.git("init", "--quiet", "--bare", "-b", "main", str(self.bare), cwd=root)
        self.git("clone", "--quiet", str(self.bare), str(self.work), cwd=root)
        self.git("checkout", "--quiet", "-b", "main")

    @property
    def url(self) -> str:
        return f"file://{self.bare}"

    def git(self, *args: str, cwd: Path | None = None) -> str:
        return subprocess.run(["git", *args], cwd=cwd or self.work, env=os.environ | GIT, check=True,
                              capture_output=True, text=True).stdout.strip()

    def commit(self, files: dict[str, bytes | None], message: str, branch: str = "main", force: bool = False) -> str:
        for name, data in files.items():
            path = self.work / name
            if data is None:
                path.unlink()
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        self.git("add", "-A")
        self.git("commit", "--quiet", "--allow-empty", "-m", message)
        self.git("push", "--quiet", *(["--force"] if force else []), "origin", f"HEAD:{branch}")
        return self.git("rev-parse", "HEAD")

    def forget_unreachable(self) -> None:
        self.git("reflog", "expire", "--expire=now", "--all", cwd=self.bare)
        self.git("gc", "--quiet", "--prune=now", cwd=self.bare)


def push_body(head: str, before: str, project: str = "bert-exports", branch: str = "main") -> bytes:
    return json.dumps({
        "ref": f"refs/heads/{branch}", "before": before, "after": head, "repository": {"name": project},
        "commits": [], "head_commit": {"id": head, "message": f"export {head[:7]}", "timestamp": "2026-11-28T10:00:00Z",
                                       "author": {"name": "Ada"}},
    }).encode()


def deliver(client, body: bytes, delivery: str, project: str = "bert-exports"):
    return deliver_push(client, body, delivery, signed(body)) if project == "bert-exports" else client.post(
        f"/api/v1/webhooks/github?project={project}", content=body,
        headers={"X-GitHub-Event": "push", "X-GitHub-Delivery": delivery, "X-Hub-Signature-256": signed(body)})


def runs(session) -> int:
    session.rollback()
    return session.scalar(select(func.count()).select_from(Run))


def test_a_signed_push_measures_the_file_at_the_pushed_commit_and_raises_its_fusion_regression(client, session, tmp_path):
    repo = ModelRepository(tmp_path)
    good = BERT.read_bytes()
    sha_a = repo.commit({"models/bert.onnx": good, "README.md": b"models\n"}, "export A")
    sha_b = repo.commit({"models/bert.onnx": insert_before_gelu(onnx.load(BERT)).SerializeToString()}, "export B")
    created = client.post("/api/v1/projects", json={
        "name": "bert-exports", "webhook_secret": SECRET, "settings": SETTINGS,
        "repository": {"url": repo.url, "models": ["models/*.onnx"]}})
    assert created.status_code == 201, created.text
    assert created.json()["repository"] == {"url": repo.url, "models": ["models/*.onnx"], "credentials_env": None}
    client.post("/api/v1/projects", json={"name": "no-repository", "webhook_secret": SECRET,
                                          "settings": SETTINGS}).raise_for_status()
    client.post("/api/v1/projects/no-repository/models", files={"file": ("bert.onnx", good)}).raise_for_status()

    first = deliver(client, push_body(sha_a, "0" * 40), "d-1")
    assert first.status_code == 202, first.text
    assert drain(client, PLUGIN) == 1
    second = deliver(client, push_body(sha_b, sha_a), "d-2")
    assert second.status_code == 202, second.text
    assert drain(client, PLUGIN) == 1
    session.rollback()
    # One alert per lost op. The Passthrough also hides the MLP output's shape from shape inference (a
    # custom op's output shape is unknown), so SkipLayerNormFusion cannot check the rank-3 residual Adds
    # after it: 3 of the 4 SkipLayerNormalizations go too, as onnxruntime's rule would refuse them.
    alerts = session.scalars(select(Alert).where(Alert.kind == "fusion-regression").order_by(Alert.op)).all()
    assert [(a.op, a.before, a.after) for a in alerts] == [
        ("com.microsoft.BiasGelu", 2, 0), ("com.microsoft.SkipLayerNormalization", 4, 1)]
    for alert in alerts:
        assert session.get(Commit, alert.commit_id).sha == sha_b
        assert session.get(Commit, alert.baseline_commit_id).sha == sha_a
        assert "Passthrough" in alert.message
    assert (tmp_path / "data" / "repositories").is_dir()

    # The same push to a project without a repository: 422 saying how to configure it, and no run.
    before = runs(session)
    refused = deliver(client, push_body(sha_b, sha_a, "no-repository"), "d-3", project="no-repository")
    assert refused.status_code == 422
    assert "has no repository and this push sends no model files" in refused.json()["detail"]
    assert '"kind": "engine"' in refused.json()["detail"]
    assert runs(session) == before
    # The generic CI hook without files is refused the same way.
    ci = client.post("/api/v1/webhooks/ci", json={"project": "no-repository", "sha": sha_b})
    assert ci.status_code in (401, 422)
    assert runs(session) == before


def test_an_engine_project_measures_its_registered_models(client, session):
    client.post("/api/v1/projects", json={"name": "engine", "kind": "engine", "settings": SETTINGS}).raise_for_status()
    client.post("/api/v1/projects/engine/models", files={"file": ("bert.onnx", BERT.read_bytes())}).raise_for_status()
    reply = client.post("/api/v1/webhooks/ci", json={"project": "engine", "sha": "ab" * 20})
    assert reply.status_code == 202 and reply.json()["jobs"] == 1  # the registered model, again
    refused = client.post("/api/v1/projects", json={"name": "both", "kind": "engine",
                                                    "repository": {"url": "https://x.org/r.git", "models": ["m.onnx"]}})
    assert refused.status_code == 422 and "takes no repository" in refused.text


def test_unreachable_missing_oversized_and_lfs_files_are_refused_by_name(client, session, tmp_path):
    repo = ModelRepository(tmp_path)
    base = repo.commit({"models/bert.onnx": BERT.read_bytes()}, "export")
    client.post("/api/v1/projects", json={"name": "bert-exports", "webhook_secret": SECRET, "settings": SETTINGS,
                                          "repository": {"url": repo.url, "models": ["models/*.onnx"]}}).raise_for_status()
    start = runs(session)

    # A force-push replaced the commit and the remote forgot it: the pushed sha cannot be fetched.
    replaced = repo.commit({"models/bert.onnx": BERT.read_bytes() + b""}, "export, amended")
    repo.git("reset", "--quiet", "--hard", base)
    rewritten = repo.commit({"notes.txt": b"rewritten\n"}, "rewritten", force=True)
    repo.forget_unreachable()
    gone = deliver(client, push_body(replaced, base), "f-1")
    assert gone.status_code == 422 and f"commit {replaced[:12]} cannot be fetched" in gone.json()["detail"]
    assert deliver(client, push_body(rewritten, replaced), "f-2").status_code == 202  # the new head is measured

    # A branch pushed and then deleted: its deletion event starts nothing; its commit is gone with it.
    on_branch = repo.commit({"models/bert.onnx": BERT.read_bytes() + b"\n"}, "on a branch", branch="topic")
    repo.git("push", "--quiet", "origin", "--delete", "topic")
    repo.forget_unreachable()
    deleted = json.dumps({"ref": "refs/heads/topic", "before": on_branch, "after": "0" * 40, "deleted": True,
                          "repository": {"name": "bert-exports"}, "commits": [], "head_commit": None}).encode()
    assert deliver(client, deleted, "f-3").json()["status"] == "ignored"
    assert deliver(client, push_body(on_branch, base, branch="topic"), "f-4").status_code == 422

    repo.git("reset", "--quiet", "--hard", rewritten)
    no_model = repo.commit({"models/bert.onnx": None}, "models moved out")
    missing = deliver(client, push_body(no_model, rewritten), "f-5")
    assert missing.status_code == 422
    assert f"no file at commit {no_model[:12]}" in missing.json()["detail"] and "models/*.onnx" in missing.json()["detail"]

    huge = repo.commit({"models/huge.onnx": os.urandom(1_200_000)}, "a huge export")
    too_big = deliver(client, push_body(huge, no_model), "f-6")
    assert too_big.status_code == 422
    assert "models/huge.onnx at commit" in too_big.json()["detail"] and "FUSIONWATCH_MAX_UPLOAD_MB" in too_big.json()["detail"]

    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 749340\n"
    lfs = repo.commit({"models/huge.onnx": None, "models/bert.onnx": pointer}, "bert in LFS")
    refused = deliver(client, push_body(lfs, huge), "f-7")
    assert refused.status_code == 422
    assert "models/bert.onnx at commit" in refused.json()["detail"] and "Git LFS pointer" in refused.json()["detail"]
    assert runs(session) == start + 1  # only the rewritten head


@pytest.mark.parametrize("url", [
    "ext::sh -c touch% /tmp/pwned", "-uhelp", "--upload-pack=touch /tmp/pwned", "http://example.com/r.git",
    "https://example.com/r.git\nx", "fd::17", "git@host:../../etc", "file:///srv/../etc", "/srv/models.git",
    "ssh://host/r.git --upload-pack=x", "ssh://-oProxyCommand=touch%20/tmp/pwned/r.git",
    "ssh://git@-oProxyCommand=x/r.git", "https:///r.git",
])
def test_hostile_repository_urls_are_refused(client, url):
    reply = client.post("/api/v1/projects", json={"name": "hostile", "repository": {"url": url, "models": ["m.onnx"]}})
    assert reply.status_code == 422 and "repository.url" in reply.text


def test_paths_outside_the_repository_credentials_and_file_urls_are_checked():
    for pattern in ("../secrets/*.onnx", "models/../../x.onnx", "/etc/passwd", "models\\x.onnx"):
        with pytest.raises(Exception, match="relative path inside the repository"):
            checked_repository({"url": "https://example.com/r.git", "models": [pattern]}, allow_file=False)
    with pytest.raises(Exception, match="FUSIONWATCH_GIT_CREDENTIALS_"):
        checked_repository({"url": "https://example.com/r.git", "models": ["m.onnx"],
                            "credentials_env": "FUSIONWATCH_DATABASE_URL"}, allow_file=False)
    with pytest.raises(Exception, match="repository.url"):
        checked_repository({"url": "file:///srv/models.git", "models": ["m.onnx"]}, allow_file=False)
    assert checked_repository({"url": "git@github.com:org/models.git", "models": ["models/*.onnx"],
                               "credentials_env": "FUSIONWATCH_GIT_CREDENTIALS_ORG"}, allow_file=False).url
