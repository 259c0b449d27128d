"""`kvhandoff explain TRACE --format svg`: the Mermaid chart drawn as one SVG file, element for
element (lanes, arrows, notes, activation bars, shaded key and violating steps)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvhandoff.cli.main import main
from kvhandoff.cli.svg_chart import mermaid_to_svg
from tests.sequential import SEQUENTIAL

NS = {"s": "http://www.w3.org/2000/svg"}


def _explain(capsys: pytest.CaptureFixture[str], trace: Path, fmt: str) -> str:
    assert main(["explain", str(trace), "--format", fmt]) == 0
    return capsys.readouterr().out


def test_the_incident_chart_as_svg_has_every_element_of_the_mermaid_chart(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "incident.jsonl"
    assert main(["check", *SEQUENTIAL, "--variant", "incident", "--trace-out", str(trace)]) == 1
    capsys.readouterr()
    mermaid = _explain(capsys, trace, "mermaid").splitlines()
    root = ET.fromstring(_explain(capsys, trace, "svg").split("\n", 1)[1])
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.findtext("s:title", namespaces=NS) == "incident: decode_reads_only_validated_pages"

    def count(cls: str) -> int:
        return len(root.findall(f".//*[@class='{cls}']"))

    lanes = [line for line in mermaid if line.strip().startswith("participant ")]
    assert count("participant") == count("lifeline") == len(lanes) == 6
    arrows = [line for line in mermaid if ">>" in line or "-)" in line or "-x" in line]
    assert count("message") == len(arrows)
    assert count("note") == sum(line.strip().startswith("Note over") for line in mermaid)
    assert count("activation") == sum(line.strip().startswith("deactivate") for line in mermaid)
    fills = [r.get("fill") for r in root.findall(".//*[@class='step']")]
    assert fills.count("rgb(255,205,205)") == 1 and fills.count("rgb(255,236,190)") == 2
    text = " ".join(t for t in root.itertext())
    assert "VIOLATED:" in text and "decode_reads_only_validated_pages" in text
    assert "NOT ITS OWN" in text
    # Everything is drawn inside the picture.
    width = float(root.get("width", "0"))
    for el in root.iter():
        for attr in ("x", "x1", "x2"):
            if el.get(attr) is not None:
                assert 0 <= float(el.get(attr, "0")) <= width, (el.tag, el.attrib)


def test_a_line_outside_the_drawn_subset_is_an_error_naming_it() -> None:
    chart = "sequenceDiagram\n    participant a\n    participant b\n    a->>b: hi\n    autonumber\n"
    with pytest.raises(ValueError, match=r"line 5: .*'autonumber'"):
        mermaid_to_svg(chart)
    with pytest.raises(ValueError, match="not a Mermaid sequence diagram"):
        mermaid_to_svg("graph TD\n")
