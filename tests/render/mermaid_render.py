"""Render Mermaid charts with the real mermaid package in headless Chromium.

Set-up (idempotent, done by `ensure_tools`): the `mermaid` npm package is installed into
`.render-cache/` at the repository root (ignored by git), and Debian's `chromium` is installed
with apt-get when /usr/bin/chromium is missing. Each chart is rendered by `mermaid.render` on a
page loaded from the local node_modules file; a parse error is written into the page, which
Chromium dumps (`--dump-dom`), so it fails the test with mermaid's own message. A screenshot of the
rendered page is kept.

Run by hand:  PYTHONPATH=. python tests/render/mermaid_render.py CHART.mmd|REPORT.md... OUT_DIR
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".render-cache"
MERMAID_VERSION = "11"
MERMAID_JS = CACHE / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
CHROMIUM = Path("/usr/bin/chromium")
MERMAID_BLOCK = re.compile(r"```mermaid\n(.*?)```", re.DOTALL)
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--allow-file-access-from-files",
]


class SetupImpossible(Exception):
    """The render tools cannot be installed here (no npm, no apt-get, no registry)."""


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def ensure_tools() -> tuple[Path, Path]:
    """Install mermaid (npm) and chromium (apt) if missing; return their paths."""
    if not MERMAID_JS.is_file():
        npm = shutil.which("npm")
        if npm is None:
            raise SetupImpossible("npm is not installed: cannot install the mermaid package")
        CACHE.mkdir(exist_ok=True)
        (CACHE / "package.json").write_text('{"name": "kvhandoff-render", "private": true}\n')
        r = _run(
            [npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", "--silent",
             f"mermaid@{MERMAID_VERSION}"],
            timeout=600,
        )  # fmt: skip
        if r.returncode != 0 or not MERMAID_JS.is_file():
            raise SetupImpossible(f"npm install mermaid failed: {r.stderr.strip()[-2000:]}")
    if not CHROMIUM.exists():
        apt = shutil.which("apt-get")
        if apt is None or os.geteuid() != 0:
            raise SetupImpossible("chromium is missing and apt-get (as root) is not available")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in ([apt, "update", "-q"], [apt, "install", "-y", "-q", "chromium"]):
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
            if r.returncode != 0:
                raise SetupImpossible(f"{' '.join(cmd)} failed: {r.stderr.strip()[-2000:]}")
        if not CHROMIUM.exists():
            raise SetupImpossible("apt-get install chromium did not provide /usr/bin/chromium")
    return MERMAID_JS, CHROMIUM


def charts_in(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".mmd":
        return [text]
    return MERMAID_BLOCK.findall(text)


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>charts</title>
<script src="{script}"></script></head>
<body style="background: white">
<pre id="status">pending</pre>
<div id="out"></div>
<script>
const charts = {charts};
(async () => {{
  mermaid.initialize({{ startOnLoad: false, securityLevel: "strict" }});
  const results = [];
  for (let i = 0; i < charts.length; i++) {{
    try {{
      await mermaid.parse(charts[i]);
      const {{ svg }} = await mermaid.render("chart" + i, charts[i]);
      const div = document.createElement("div");
      div.innerHTML = svg;
      document.getElementById("out").appendChild(div);
      results.push("OK");
    }} catch (e) {{
      results.push("ERROR " + (e && e.message ? e.message : String(e)));
    }}
  }}
  document.getElementById("status").textContent = "RESULTS " + JSON.stringify(results);
}})();
</script></body></html>
"""


@dataclass
class RenderResult:
    results: list[str]  # "OK" or "ERROR <mermaid's message>", one per chart
    screenshot: Path
    page: Path
    dom: str  # the rendered page, as Chromium dumped it

    @property
    def errors(self) -> list[str]:
        return [r for r in self.results if r != "OK"]


def render(charts: list[str], out_dir: Path, name: str = "charts") -> RenderResult:
    """Render `charts` on one page; return each chart's result and a screenshot of the page."""
    mermaid_js, chromium = ensure_tools()
    out_dir.mkdir(parents=True, exist_ok=True)
    page = out_dir / f"{name}.html"
    page.write_text(
        PAGE.format(script=mermaid_js.as_uri(), charts=json.dumps(charts)), encoding="utf-8"
    )
    screenshot = out_dir / f"{name}.png"
    with tempfile.TemporaryDirectory(prefix="kvhandoff-chromium-") as profile:
        common = [str(chromium), *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
        wait = "--virtual-time-budget=20000"
        dom = _run([*common, wait, "--dump-dom", page.as_uri()], timeout=120)
        # Tall enough for a long chart; the screenshot is for a person to look at.
        _run(
            [*common, wait, "--window-size=1400,4200", f"--screenshot={screenshot}",
             page.as_uri()],
            timeout=120,
        )  # fmt: skip
    match = re.search(r"RESULTS (\[.*?\])</pre>", dom.stdout, re.DOTALL)
    if match is None:
        status = re.search(r'<pre id="status">(.*?)</pre>', dom.stdout, re.DOTALL)
        found = status.group(1) if status else dom.stdout[-500:] + dom.stderr[-1500:]
        raise AssertionError(f"the page did not finish rendering: {found}")
    results: list[str] = json.loads(html.unescape(match.group(1)))
    return RenderResult(results, screenshot, page, dom.stdout)


if __name__ == "__main__":
    *inputs, out = sys.argv[1:]
    charts = [c for p in inputs for c in charts_in(Path(p))]
    result = render(charts, Path(out))
    print("\n".join(result.results))
    print(f"screenshot: {result.screenshot}")
    sys.exit(1 if result.errors else 0)
