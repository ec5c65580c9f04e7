"""The HTML report in a real browser: the distribution's headless Chromium (driven by Playwright, which
downloads nothing), pages served over HTTP on loopback by the test. Screenshots go to tests/artifacts/."""

from __future__ import annotations

import functools
import shutil
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from rollout_audit.cli import main

sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip("headless Chromium is not installed (apt-get install chromium; .ci/run does)", allow_module_level=True)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
PAGES = {"compliant": FIXTURES / "compliant", "broken": FIXTURES / "broken" / "tool_tokens_trained"}
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep pytest's output clean
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[str]:
    """The report of the compliant fixture and of one broken fixture, served on 127.0.0.1."""
    root = tmp_path_factory.mktemp("site")
    for name, log in PAGES.items():
        res = CliRunner().invoke(main, ["report", str(log), "-o", str(root / f"{name}.html")])
        assert res.exit_code == (0 if name == "compliant" else 1), res.output
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield b
        b.close()


def _open(browser, url: str, shot: str):
    """Load a page; returns (page, console errors). Saves a full-page screenshot to tests/artifacts/."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    assert page.goto(url).ok
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
    print(f"screenshot: {ARTIFACTS / shot}")
    return page, errors


DANGLING = (
    "[...document.querySelectorAll('a[href^=\"#\"]')].filter(a => !document.getElementById(a.hash.slice(1))).length"
)


def test_compliant_page_renders_verdict_checks_findings_and_plots(browser, site):
    page, errors = _open(browser, f"{site}/compliant.html", "report-compliant.png")
    assert errors == []
    assert page.locator("#verdict").inner_text().startswith("OK")
    assert page.evaluate(DANGLING) == 0
    rows = page.locator("#checks tr[data-status]")
    assert rows.count() > 40
    assert page.locator('#check-M101[data-status="pass"]').count() == 1
    assert page.locator("#check-L205[data-status=notrun]").count() == 1  # not run, with its reason shown
    details = page.locator("#check-M101 details")
    assert not details.locator("pre").is_visible()
    details.locator("summary").click()  # the rule's explanation is one click away
    assert "Lesson" in details.locator("pre").inner_text()
    figs = page.locator("figure.plot svg")
    assert figs.count() >= 6
    assert all(b["width"] > 100 for b in (figs.nth(i).bounding_box() for i in range(figs.count())))
    page.close()


def test_broken_page_shows_its_fault(browser, site):
    page, errors = _open(browser, f"{site}/broken.html", "report-tool_tokens_trained.png")
    assert errors == []
    assert page.locator("#verdict").inner_text().startswith("FAIL")
    assert "M101" in page.locator("#verdict").inner_text()
    assert page.locator('#check-M101[data-status="fail"]').count() == 1
    page.locator("#check-M101 a").click()  # the code links to its findings
    assert page.evaluate("location.hash") == "#f-M101" and page.evaluate(DANGLING) == 0
    section = page.locator("#f-M101")
    assert section.locator("tr").count() > 1 and "observation" in section.inner_text().lower()
    share = page.locator('svg[aria-label="trainable share by token source"]')
    assert share.locator('rect[fill="#c0392b"]').count() >= 1  # a non-policy source is in the loss
    page.goto(f"{site}/compliant.html")
    assert page.locator('svg[aria-label="trainable share by token source"] rect[fill="#c0392b"]').count() == 0
    page.close()
