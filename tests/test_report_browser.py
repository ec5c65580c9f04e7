"""The HTML report in a real browser: the distribution's headless Chromium (driven by Playwright, which
downloads nothing), pages served over HTTP on loopback by the test. Screenshots go to tests/artifacts/."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CHROMIUM, NO_CHROMIUM, write_log

from rollout_audit.cli import main
from rollout_audit.reporting.html import svg
from rollout_audit.synth import make_log

sync_api = pytest.importorskip("playwright.sync_api")
if not Path(CHROMIUM).exists():
    pytest.skip(NO_CHROMIUM, allow_module_level=True)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
PAGES = {"compliant": FIXTURES / "compliant", "broken": FIXTURES / "broken" / "tool_tokens_trained"}
# broken logs whose findings show in the plots: points off the diagonal (with a recorded value of
# four digits on the axis), a positive log-prob, a negative lag
PLOTTED = ("loss_over_whole_transcript", "positive_logprob", "policy_version_decreasing")
PAGES.update({name: FIXTURES / "broken" / name for name in PLOTTED})
NAMES = [*PAGES, "inverted"]  # and a log whose one task pays its failures, not its successes
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
    """The reports of the compliant fixture, of broken ones, of a log with an inverted task, and a page of
    plots at their widest labels, served on 127.0.0.1."""
    root = tmp_path_factory.mktemp("site")
    trajs, ups = make_log(seed=1)
    scored = [t for t in trajs if t["reward"] is not None]
    mixed = next(
        k
        for k in sorted({t["task_id"] for t in scored})
        if len({t["verifier_success"] for t in scored if t["task_id"] == k}) == 2
    )
    for t in trajs:  # the verdicts of one task with both outcomes flipped: its failures are paid, its successes not
        if t["task_id"] == mixed:
            t["verifier_success"] = not t["verifier_success"]
    logs = {**PAGES, "inverted": write_log(root / "inverted-log", trajs, ups)}
    (root / "extremes.html").write_text(_extremes())
    for name, log in logs.items():
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
    assert share.locator('rect.fault[fill="#c0392b"]').count() >= 1  # a non-policy source is in the loss
    page.goto(f"{site}/compliant.html")
    assert page.locator('svg[aria-label="trainable share by token source"] rect.fault').count() == 0
    page.close()


# Every piece of text the page renders, as boxes: SVG <text> elements, and each line of each HTML
# text node (headings, table cells, labels, captions, notes), measured on the text itself so that
# text overflowing its element is caught too. Pairs that intersect by more than TOL px both ways.
TOL = 1.0
OVERLAPS = """(tol) => {
  const boxes = [];
  const add = (r, el, text) => {
    if (r.width > 0 && r.height > 0) boxes.push({l: r.left, t: r.top, r: r.right, b: r.bottom, el, text});
  };
  for (const t of document.querySelectorAll('svg text')) add(t.getBoundingClientRect(), t, t.textContent);
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) {
    const n = walk.currentNode;
    const el = n.parentElement;  // text in a closed <details> is laid out but not shown
    if (!n.textContent.trim() || el.closest('svg, style') || !el.checkVisibility({contentVisibilityAuto: true})) continue;
    const range = document.createRange();
    range.selectNodeContents(n);
    for (const r of range.getClientRects()) add(r, n.parentElement, n.textContent.trim());
  }
  const hits = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i], b = boxes[j];
    const w = Math.min(a.r, b.r) - Math.max(a.l, b.l), h = Math.min(a.b, b.b) - Math.max(a.t, b.t);
    if (w > tol && h > tol) hits.push(`${JSON.stringify(a.text)} / ${JSON.stringify(b.text)}: ${w.toFixed(1)}x${h.toFixed(1)}`);
  }
  const clipped = [...document.querySelectorAll('svg text')].filter(t => {
    const r = t.getBoundingClientRect(), s = t.ownerSVGElement.getBoundingClientRect();
    return r.left < s.left - tol || r.right > s.right + tol || r.top < s.top - tol || r.bottom > s.bottom + tol;
  }).map(t => t.textContent);
  return {n: boxes.length, svg: document.querySelectorAll('svg text').length, hits, clipped,
          wide: document.documentElement.scrollWidth - document.documentElement.clientWidth};
}"""


# The colours every element paints (its text when it holds text, an SVG shape's fill and stroke, a
# box's border), those that are red (hue within 25 degrees of red, saturated, not pale), and for each
# red one whether it stands for an error the audit found: an SVG mark of class `fault`, the FAIL
# verdict, the row of a failing check, the findings of an error code, or a legend's swatch.
RED = """() => {
  const rgb = c => (c.match(/[\\d.]+/g) || []).map(Number);
  const red = c => {
    const [r, g, b, a] = rgb(c);
    if (r === undefined || a === 0) return false;
    const hi = Math.max(r, g, b), lo = Math.min(r, g, b);
    if (hi < 90 || (hi - lo) / hi < 0.5 || hi !== r) return false;
    const hue = ((g - b) / (hi - lo)) * 60;
    return hue > -25 && hue < 25;
  };
  const paints = el => {
    const cs = getComputedStyle(el), out = [];
    const svg = el instanceof SVGElement;
    const ownText = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (svg && el.tagName !== 'svg' && el.tagName !== 'g' && el.tagName !== 'title') {
      if (cs.fill !== 'none') out.push(cs.fill);
      if (cs.stroke !== 'none') out.push(cs.stroke);
    } else if (!svg) {
      if (ownText) out.push(cs.color);
      if (parseFloat(cs.borderTopWidth) > 0) out.push(cs.borderTopColor);
    }
    return out.filter(red);
  };
  const why = el => el.closest('.fault') ? 'mark' : el.closest('#verdict.fail') ? 'verdict'
    : el.closest('#checks tr[data-status="fail"]') ? 'failing check'
    : el.closest('section.code') && el.closest('section.code').querySelector('h3.sev-error') ? 'error findings'
    : el.closest('.legend') ? 'legend' : null;
  return [...document.querySelectorAll('body *')].filter(el => paints(el).length)
    .map(el => ({why: why(el), what: el.outerHTML.slice(0, 160)}));
}"""


@pytest.fixture(scope="module")
def measured(browser, site) -> dict[str, dict]:
    """Each page loaded once: its console errors, its text boxes' overlaps and its red paint."""
    out = {}
    for name in NAMES:
        page, errors = _open(browser, f"{site}/{name}.html", f"report-{name}.png")
        out[name] = {"errors": errors, "text": page.evaluate(OVERLAPS, TOL), "red": page.evaluate(RED)}
        page.close()
    return out


@pytest.mark.parametrize("name", NAMES)
def test_no_text_overlaps_and_none_is_clipped(measured, name):
    got = measured[name]["text"]
    assert measured[name]["errors"] == []
    assert got["svg"] > 50 and got["n"] > got["svg"] + 200  # the plots' labels and the page's text were measured
    assert got["hits"] == [], got["hits"][:10]
    assert got["clipped"] == []  # every label lies inside its plot
    assert got["wide"] <= 0  # nothing runs off the page sideways


def _extremes() -> str:
    """Every kind of plot with the labels that take the most room: tick values of ten characters
    (the scatter's y ticks beside its rotated axis title), labels cut at their limit, long legends."""
    long = "x" * 40
    figs = [
        svg.scatter("tiny values", [(-1.234567e-05, -1.2345e-05), (2.5e-05, 3.1e-05)], long, long),
        svg.scatter("large values", [(-123456.7, 98765.43), (1e6 + 0.5, 1e6)], "recomputed", "recorded"),
        svg.bars("bars", [(long, -1.2345e-05, svg.FAULT), ("b", 123456.5, None)], legend=[("box", svg.FAULT, long)]),
        svg.boxes(
            "boxes",
            [
                (
                    long,
                    {
                        "min": -1.2345e-05,
                        "q05": -1e-05,
                        "q25": -5e-06,
                        "q50": 0,
                        "q75": 5e-06,
                        "q95": 1e-05,
                        "max": 1.2345e-05,
                        "n": 3,
                        "colour": svg.FAULT,
                    },
                )
            ],
            zero="zero",
        ),  # fmt: skip
        svg.dots(
            "dots", [(long, {"a": -1.2345e-05, long: 1.2345e-05}, True)], {"a": "#111", long: "#222"}, flagged=long
        ),
        svg.stacked("stacked", [(long, {f"{long}{i}": i + 1 for i in range(6)})]),
    ]
    return f'<!doctype html><meta charset="utf-8"><link rel="icon" href="data:,"><body>{"".join(figs)}</body>'


def test_plots_at_their_widest_labels_do_not_overlap(browser, site):
    page, errors = _open(browser, f"{site}/extremes.html", "report-extremes.png")
    got = page.evaluate(OVERLAPS, TOL)
    assert errors == [] and got["svg"] > 30
    assert got["hits"] == [] and got["clipped"] == [], got
    page.close()


def _fill(scope, selector: str) -> list[str]:
    return scope.locator(selector).evaluate_all("els => els.map(e => getComputedStyle(e).fill)")


@pytest.mark.parametrize("name", NAMES)
def test_red_means_an_error_found_and_nothing_else(measured, name):
    reds = measured[name]["red"]
    assert [r for r in reds if r["why"] is None] == []
    if name == "compliant":
        assert {r["why"] for r in reds} <= {"legend"}  # a clean log paints nothing red but the keys
    else:
        assert {"verdict", "failing check", "error findings"} <= {r["why"] for r in reds}


def test_mismatch_marks_and_reward_marks_do_not_share_a_colour(browser, site):
    page, _ = _open(browser, f"{site}/loss_over_whole_transcript.html", "report-loss_over_whole_transcript.png")
    scatter = page.locator('svg[aria-label^="loss denominator per update"]')
    off = _fill(scatter, ":scope > circle.fault")
    on = _fill(scatter, ":scope > circle:not(.fault)")
    assert off and on and set(off) == {"rgb(192, 57, 43)"} and "rgb(192, 57, 43)" not in on
    assert any("mismatch" in t for t in scatter.locator(".legend text").all_text_contents())
    tasks = page.locator('svg[aria-label="reward vs verifier success per task"]')
    rewards = set(_fill(tasks, ":scope > circle"))
    assert len(rewards) == 2 and not rewards & (set(off) | set(on))  # two series, neither a judgement colour
    keys = tasks.locator(".legend text").all_text_contents()
    assert "reward | success" in keys and "reward | failure" in keys
    page.goto(f"{site}/inverted.html")
    tasks = page.locator('svg[aria-label="reward vs verifier success per task"]')
    flagged = tasks.locator("text.fault")
    assert flagged.count() >= 1 and _fill(tasks, "text.fault") == ["rgb(192, 57, 43)"] * flagged.count()
    assert "failures are paid more" in " ".join(tasks.locator(".legend text").all_text_contents())
    page.close()


def test_a_passing_check_shows_its_severity_neutrally(browser, site):
    page, _ = _open(browser, f"{site}/broken.html", "report-tool_tokens_trained.png")
    colours = page.eval_on_selector_all(
        "#checks tr[data-status]",
        "rows => rows.map(r => [r.dataset.status, r.cells[3].textContent, getComputedStyle(r.cells[3]).color])",
    )
    red = "rgb(176, 0, 32)"
    passed = [c for s, sev, c in colours if s == "pass" and sev == "error"]
    assert len(passed) > 20 and red not in passed
    assert [c for s, sev, c in colours if s == "fail"] == [red]  # M101, the one check that found errors
    assert all(c != red for s, _, c in colours if s != "fail")
    page.close()
