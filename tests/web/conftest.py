"""Fixtures for the dashboard's tests.

TestClient tests use the service's database fixtures (SQLite, and PostgreSQL when configured). Browser
tests drive Debian's Chromium (/usr/bin/chromium, which `make test` installs) through Playwright against
a real `fusionwatch serve` on a seeded SQLite database; they skip, saying why, only where Chromium is
absent. Every page a browser test opens fails the test on a console error or an uncaught exception,
and screenshots land in FUSIONWATCH_SCREENSHOTS (default var/screenshots/, not in git).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.auth import COOKIE
from tests.service.db_fixtures import (  # noqa: F401
    client,
    database_url,
    migrated_database_url,
    service_settings,
    session,
)
from tests.service.serving import serving
from tests.web import seed

CHROMIUM = Path("/usr/bin/chromium")
# As the machine notes say: no sandbox as root, and no background connections to a closed network.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOTS = Path(os.environ.get("FUSIONWATCH_SCREENSHOTS", Path(__file__).parents[2] / "var" / "screenshots"))


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    """`fusionwatch db upgrade` then `fusionwatch serve` (with its embedded worker) on a fresh SQLite
    database, seeded with seed's history through the API; yields its base URL."""
    with serving(tmp_path_factory.mktemp("dashboard"), FUSIONWATCH_POLL_INTERVAL_S="0.2") as (api, _process):
        base = api.removesuffix("/api/v1")
        token = os.environ["FUSIONWATCH_TOKEN"]
        with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {token}"}) as http:
            seed.seed(http.post)
        yield base


@pytest.fixture(scope="module")
def browser() -> Iterator:
    if not CHROMIUM.is_file():
        no_apt = "; this machine has no apt-get" if shutil.which("apt-get") is None else ""
        pytest.skip(reason=f"{CHROMIUM} is missing (`make test` installs Debian's chromium; "
                           f"apt-get install -y chromium){no_apt}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # Playwright gives each launch a fresh, empty user-data directory.
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser, server) -> Iterator:
    """A page in a fresh context whose time zone is not UTC; console errors and uncaught exceptions fail the test."""
    context = browser.new_context(base_url=server, timezone_id="America/New_York", locale="en-US",
                                  viewport={"width": 1280, "height": 900})
    # Signed in, as after the sign-in page (test_browser.py walks that page itself).
    context.add_cookies([{"name": COOKIE, "value": os.environ["FUSIONWATCH_TOKEN"], "url": server}])
    opened = context.new_page()
    problems: list[str] = []
    opened.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    opened.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    yield opened
    context.close()
    assert problems == [], problems


def screenshot(page, name: str, full_page: bool = True) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path
