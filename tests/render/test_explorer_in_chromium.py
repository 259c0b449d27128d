"""The trace explorer page in headless Chromium: it loads offline, the buttons step forward and
back, the DOM shows the lanes and the violated property at the breaking step; a screenshot of the
breaking step is kept (tests/render/out/explorer.png, ignored by git).

Slow (installs Debian's chromium if missing): `make test-render`.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from kvhandoff.cli.main import main
from tests.render.mermaid_render import CHROMIUM, CHROMIUM_FLAGS, SetupImpossible
from tests.sequential import SEQUENTIAL

pytestmark = pytest.mark.slow
KEEP = Path(__file__).resolve().parent / "out"

# Appended to a copy of the page: press the real buttons, then record what the page shows.
PRESS = """<script>
const log = [];
const press = id => { document.getElementById(id).click(); log.push(document.body.dataset.step); };
press("first"); press("next"); press("next"); press("prev"); press("last");
document.body.dataset.pressed = log.join(",");
</script></body>"""


def _chromium() -> Path:
    if CHROMIUM.is_file():
        return CHROMIUM
    apt = shutil.which("apt-get")
    if apt is None:
        raise SetupImpossible("chromium is missing and apt-get is not available")
    for cmd in ([apt, "update", "-q"], [apt, "install", "-y", "-q", "chromium"]):
        subprocess.run(cmd, capture_output=True, timeout=900, check=False)
    if not CHROMIUM.is_file():
        raise SetupImpossible("apt-get install chromium did not provide /usr/bin/chromium")
    return CHROMIUM


def _dom(chromium: Path, url: str, extra: list[str] | None = None) -> str:
    with tempfile.TemporaryDirectory(prefix="kvhandoff-chromium-") as profile:
        cmd = [str(chromium), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
               "--virtual-time-budget=5000", *(extra or ["--dump-dom"]), url]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    return out.stdout


def test_the_explorer_steps_and_shows_the_break(tmp_path: Path) -> None:
    try:
        chromium = _chromium()
    except SetupImpossible as exc:
        pytest.skip(str(exc))
    trace = tmp_path / "incident.jsonl"
    with contextlib.redirect_stdout(io.StringIO()):
        main(
            [
                "check",
                *SEQUENTIAL,
                "--variant",
                "incident",
                "--set",
                "max_faults=0",
                "--trace-out",
                str(trace),
            ]
        )
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["explain", str(trace), "--format", "html"]) == 0
    page = tmp_path / "explorer.html"
    page.write_text(buffer.getvalue(), encoding="utf-8")
    steps = len(trace.read_text().strip().splitlines()) - 1

    # The buttons: first, next, next, back, last.
    pressed = tmp_path / "pressed.html"
    pressed.write_text(buffer.getvalue().replace("</body>", PRESS), encoding="utf-8")
    dom = _dom(chromium, pressed.as_uri())
    match = re.search(r'data-pressed="([^"]*)"', dom)
    assert match, dom[-2000:]
    assert match.group(1) == f"0,1,2,1,{steps}"

    # Opened at the breaking step (the default): the property is highlighted there.
    dom = _dom(chromium, page.as_uri())
    assert f'data-step="{steps}"' in dom
    assert re.search(r'id="violation-0"[^>]*data-property="no_cross_tenant_read"', dom) or (
        'data-property="no_cross_tenant_read"' in dom
    )
    assert "VIOLATED here: " in dom
    # Lanes: 3 pages x (steps + 1) columns per story; the reference beside it breaks nothing.
    assert len(re.findall(r'class="lane-cell', dom)) >= 3 * (steps + 1)
    assert 'id="story-1"' in dom and 'id="violation-1"' not in dom
    # A page owned by tenant b holding tenant a's data is ringed.
    assert "mismatch" in dom

    # Step 1, from the link: nothing is violated yet.
    dom = _dom(chromium, page.as_uri() + "#step=1")
    story0 = dom.split('id="story-0"', 1)[1].split('id="story-1"')[0]
    assert 'data-step="1"' in dom and 'class="violation' not in story0
    assert "step 1 of " in story0

    KEEP.mkdir(exist_ok=True)
    shot = KEEP / "explorer.png"
    _dom(chromium, page.as_uri(), ["--window-size=1400,1600", f"--screenshot={shot}"])
    assert shot.is_file() and shot.stat().st_size > 10_000
