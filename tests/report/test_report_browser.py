"""report.html in a real headless browser (Chromium from the system packages): it loads with no
console errors, every plot renders as a non-empty SVG, the op matrix has a row per catalogue op.
The screenshot and the page are kept under reports/report/ (CI's artifact).

Without a Chromium on PATH the test skips, saying how to get one, unless
HWRUN_TEST_REQUIRE_BROWSER=1 (set by .ci/run, which installs Debian's chromium): then it fails.
"""

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO, RESULTS

from hwrun.cli import cli
from hwrun.ops import catalogue

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
ARTIFACTS = REPO / "reports" / "report"

# Injected into a copy of the page only (the report itself has no script): records console
# errors and uncaught exceptions, and after load each SVG's laid-out size and drawn elements.
PROBE = """<script>
window.__probe = {errors: []};
const originalError = console.error;
console.error = (...args) => { __probe.errors.push(args.join(' ')); originalError(...args); };
window.addEventListener('error', e => __probe.errors.push('uncaught: ' + e.message));
window.addEventListener('load', () => {
  __probe.svgs = [...document.querySelectorAll('.plot svg')].map(svg => {
    const box = svg.getBoundingClientRect();
    return {width: box.width, height: box.height,
            drawn: svg.querySelectorAll('path, use, rect, text').length};
  });
  document.body.setAttribute('data-probe', JSON.stringify(__probe));
});
</script>"""


def _browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("HWRUN_TEST_REQUIRE_BROWSER") == "1":
        pytest.fail(
            "HWRUN_TEST_REQUIRE_BROWSER=1 but no Chromium on PATH (apt-get install chromium)"
        )
    pytest.skip("no Chromium on PATH: `apt-get install chromium` (Debian) to run the browser test")


def _chromium(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


class _OpRows(HTMLParser):
    """The first cell of each body row of table#ops-table."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self._table = self._body = self._first = False
        self._cells = 0

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._table = dict(attrs).get("id") == "ops-table"
        elif self._table and tag == "tbody":
            self._body = True
        elif self._body and tag == "tr":
            self._cells = 0
        elif self._body and tag == "td":
            self._cells += 1
            self._first = self._cells == 1

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = self._body = False
        elif tag == "td":
            self._first = False

    def handle_data(self, data):
        if self._first and data.strip():
            self.ops.append(data.strip())


def test_report_html_in_headless_chromium(tmp_path):
    browser = _browser()
    out = tmp_path / "report"
    done = CliRunner().invoke(
        cli,
        [
            "report",
            *(x for p in sorted(RESULTS.glob("*/results.jsonl")) for x in ("--conformance", p)),
            *(x for p in sorted(RESULTS.glob("*/bench/*.json")) for x in ("--bench", p)),
            "--models", "kimi-k3.1-pro",
            "--format", "html",
            "--out", str(out),
        ],
        catch_exceptions=False,
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    page = out / "report.html"
    text = page.read_text()
    plots = text.count('<div class="plot"')
    assert plots >= 5  # three capacity plots, and the benchmarks'

    # The page as shipped: no console message at all (it has no script; a failed load would log).
    shown = _chromium(browser, tmp_path / "profile", "--dump-dom", page.as_uri())
    assert shown.returncode == 0, shown.stderr[-2000:]
    console = [line for line in shown.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []
    parser = _OpRows()
    parser.feed(shown.stdout)
    assert parser.ops == list(catalogue())

    probed = tmp_path / "probed.html"
    probed.write_text(text.replace("<head>", "<head>" + PROBE, 1))
    shown = _chromium(browser, tmp_path / "profile", "--dump-dom", probed.as_uri())
    assert shown.returncode == 0, shown.stderr[-2000:]
    match = re.search(r'data-probe="([^"]*)"', shown.stdout)
    assert match, "the probe did not run: the page never finished loading"
    probe = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert probe["errors"] == []
    assert len(probe["svgs"]) == plots
    for svg in probe["svgs"]:
        assert svg["width"] > 100 and svg["height"] > 100 and svg["drawn"] > 10, svg

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(page, ARTIFACTS / "report.html")
    screenshot = ARTIFACTS / "screenshot.png"
    screenshot.unlink(missing_ok=True)
    shot = _chromium(
        browser,
        tmp_path / "profile",
        f"--screenshot={screenshot}",
        "--window-size=1400,2000",
        "--hide-scrollbars",
        page.as_uri(),
    )
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_html_needs_no_script_and_no_network(tmp_path):
    done = CliRunner().invoke(
        cli, ["report", "--models", "deepseek-v3.2", "--format", "html", "--out", str(tmp_path)]
    )
    assert done.exit_code == 0, done.output
    text = (tmp_path / "report.html").read_text()
    assert "<script" not in text
    assert not re.search(r"""(src|href)=["'](?!#)""", text), "only in-page links"
    assert not re.search(r"url\((?!#)", text), "only in-page references (SVG clip paths)"
    assert "<link" not in text and "@import" not in text
    ids = re.findall(r' id="([^"]+)"', text)
    assert len(ids) == len(set(ids)), "each plot's SVG ids are its own"
