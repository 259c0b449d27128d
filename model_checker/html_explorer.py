"""A trace as one self-contained HTML page to step through in a browser (`explain --format html`).

The page embeds the replayed story as JSON (`<script type="application/json" id="trace-data">`)
and a few hundred lines of plain JavaScript and CSS: no CDN, no network, so it opens from a CI
artifact, a mail attachment or an air-gapped machine. What it shows, step by step:

- decode's pages as lanes, one row per page and one column per step, each cell coloured by the
  tenant whose data the page holds after that step (hatched: granted but still zeroed; a ring: the
  page's owner belongs to another tenant than its data, the shape of the incident's leak);
- what the step changed (the narrative's lines) and the messages and page writes in flight;
- each request's phase at router, prefill and decode;
- the property that breaks, highlighted at the step where it breaks and named from there on;
- optionally, a second story on the same requests (the reference protocol) beside the first.

The data is built here from `model_checker.explain.Story`; the page only draws it.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

from kvhandoff.model_checker.explain import (
    Story,
    action_text,
    message_text,
    request_label,
    tag_text,
    verdict_line,
    write_text,
)
from kvhandoff.spec.actions import action_name, is_fault
from kvhandoff.spec.state import State, Tag

# Colour-blind-safe palette (Okabe-Ito), one per tenant in the order the config names them.
PALETTE = ("#E69F00", "#56B4E9", "#009E73", "#CC79A7", "#0072B2", "#D55E00", "#F0E442")
OTHER_COLOUR = "#777777"


def _tag(tag: Tag | None) -> dict[str, Any] | None:
    if tag is None:
        return None
    return {"request": tag.request, "generation": tag.generation, "tenant": tag.tenant}


def _lane(name: str) -> str:
    for lane in ("router", "prefill", "decode", "client"):
        if name.startswith(lane):
            return lane
    return "network"


def state_json(story: Story, state: State) -> dict[str, Any]:
    config = story.config
    ranks = config.prefill_ranks
    tenants = [r.tenant for r in config.requests]
    pages = []
    for i, p in enumerate(state.pages):
        owner = None
        if p.owner is not None:
            r, gen = p.owner
            owner = {"request": r, "generation": gen, "tenant": tenants[r] if r >= 0 else None}
        pages.append(
            {
                "page": i,
                "owner": owner,
                "content": _tag(p.content),
                "shards": [_tag(t) for t in p.shards],
                "text": tag_text(p.content),
            }
        )
    requests = []
    for r, req in enumerate(state.requests):
        answer = None
        if req.answer is not None:
            if req.answer.ok:
                read = sorted({t.tenant for t in req.answer.tags if t is not None})
                answer = "output from data of tenant " + (", ".join(read) or "nobody (zeroed)")
            else:
                answer = "error: " + (req.answer.reason or "refused")
        requests.append(
            {
                "request": r,
                "label": request_label(config, r),
                "tenant": tenants[r],
                "submitted": req.submitted,
                "prefill": req.p,
                "decode": req.d,
                "decode_pages": list(req.d_pages),
                "answer": answer,
            }
        )
    return {
        "pages": pages,
        "requests": requests,
        "messages": [message_text(m, ranks) for m in state.network],
        "lost": [message_text(m, ranks) for m in state.lost],
        "writes": [write_text(w, ranks) for w in state.writes],
    }


def story_json(story: Story, title: str) -> dict[str, Any]:
    bad = story.violation_step
    steps = []
    for s in story.steps:
        name = action_name(s.action)
        steps.append(
            {
                "index": s.index,
                "action": name,
                "text": action_text(s.action, story.config),
                "lane": "fault" if is_fault(s.action) else _lane(name),
                "changes": list(s.changes),
                "violated": [{"name": p.name, "claim": p.claim} for p in s.newly_violated],
                "state": state_json(story, s.after),
            }
        )
    initial = story.steps[0].before if story.steps else story.final
    return {
        "title": title,
        "variant": story.variant.name,
        "property": story.property_name,
        "kind": story.kind,
        "verdict": verdict_line(story),
        "violation_step": bad.index if bad is not None else None,
        "loop_start": story.loop_start,
        "initial": state_json(story, initial),
        "steps": steps,
    }


def explorer_data(stories: Sequence[tuple[str, Story]]) -> dict[str, Any]:
    first = stories[0][1]
    tenants: list[str] = []
    for r in first.config.requests:
        if r.tenant not in tenants:
            tenants.append(r.tenant)
    colours = {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(tenants)}
    return {
        "format": "kvhandoff.explorer/1",
        "tenants": colours,
        "other_colour": OTHER_COLOUR,
        "stories": [story_json(story, title) for title, story in stories],
    }


def to_html(story: Story, against: Story | None = None, against_title: str = "") -> str:
    """The page for `story`, with `against` (the same requests under another variant) beside it."""
    stories = [(f"{story.variant.name}", story)]
    if against is not None:
        stories.append((against_title or against.variant.name, against))
    data = explorer_data(stories)
    # `</` inside a script element would end it: JSON allows the escaped form.
    payload = json.dumps(data, sort_keys=True).replace("</", "<\\/")
    title = f"kvhandoff trace explorer: {story.variant.name}"
    if story.property_name:
        title += f", {story.property_name}"
    return (
        _PAGE.replace("__TITLE__", html.escape(title))
        .replace("__CSS__", _CSS)
        .replace("__JS__", _JS)
        .replace("__DATA__", payload)
    )


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>__CSS__</style>
</head>
<body>
<header>
  <h1>__TITLE__</h1>
  <p class="help">Step with the buttons, the slider or the arrow keys (Home/End: first/last).
  Lanes: one row per decode page, one column per step; a cell's colour is the tenant whose data
  the page holds after that step (hatched: granted, not yet written; a ring: the page is owned by
  another tenant's request than its data). The link keeps the step: <code>#step=N</code>.</p>
  <div id="legend"></div>
  <nav>
    <button id="first" title="first step (Home)">&laquo; first</button>
    <button id="prev" title="previous step (&larr;)">&#x25C0; back</button>
    <input id="slider" type="range" min="0" value="0" aria-label="step">
    <button id="next" title="next step (&rarr;)">forward &#x25B6;</button>
    <button id="last" title="last step (End)">last &raquo;</button>
    <span id="step-index"></span>
  </nav>
</header>
<main id="stories"></main>
<noscript>This page needs JavaScript to step through the trace; the data is in the
trace-data script element.</noscript>
<script type="application/json" id="trace-data">__DATA__</script>
<script>__JS__</script>
</body>
</html>
"""

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 1.5em 2em; color: #222; }
h1 { font-size: 1.3em; margin: .6em 0 .2em; }
h2 { font-size: 1.1em; margin: .4em 0; }
h3 { font-size: 1em; margin: .8em 0 .3em; }
.help { color: #555; max-width: 70em; margin: .2em 0 .5em; }
header { position: sticky; top: 0; background: #fff; padding-bottom: .4em;
         border-bottom: 1px solid #ddd; z-index: 2; }
nav { display: flex; gap: .5em; align-items: center; }
nav input { flex: 1; max-width: 40em; }
button { font: inherit; padding: .2em .7em; }
#step-index { font-weight: 600; min-width: 10em; }
#legend span { display: inline-block; margin-right: 1em; }
.swatch { display: inline-block; width: 1em; height: 1em; vertical-align: -2px;
          border: 1px solid #444; margin-right: .3em; }
#stories { display: flex; gap: 2em; flex-wrap: wrap; }
.story { flex: 1 1 36em; min-width: 30em; }
.verdict { font-weight: 600; }
.violation { background: #fde2e1; border: 2px solid #c62828; padding: .4em .6em;
             margin: .4em 0; border-radius: 4px; }
.violation.earlier { background: #fff4f4; border-style: dashed; }
.action { font-family: ui-monospace, monospace; background: #f3f3f3; padding: .3em .5em;
          border-left: 4px solid #888; }
.action.fault { border-left-color: #c62828; }
.action.router { border-left-color: #6a1b9a; }
.action.prefill { border-left-color: #1565c0; }
.action.decode { border-left-color: #2e7d32; }
.lanes { border-collapse: collapse; font-size: 12px; }
.lanes th { font-weight: 500; padding: 0 .4em; text-align: right; white-space: nowrap; }
.lanes td.lane-cell { width: 14px; height: 20px; border: 1px solid #fff; padding: 0; }
.lanes td.empty { background: #eee; }
.lanes td.zeroed { background: repeating-linear-gradient(45deg, #ddd 0 3px, #fff 3px 6px); }
.lanes td.mismatch { box-shadow: inset 0 0 0 3px #c62828; }
.lanes td.current { outline: 2px solid #000; outline-offset: -1px; }
.lanes td.bad-step { border-bottom: 3px solid #c62828; }
.lanes th.col { font-size: 10px; padding: 0; text-align: center; width: 14px; }
.lanes th.col.current { background: #000; color: #fff; }
.lanes th.col.bad-step { color: #c62828; font-weight: 700; }
ul { margin: .2em 0; padding-left: 1.4em; }
table.reqs { border-collapse: collapse; }
table.reqs td, table.reqs th { border: 1px solid #ddd; padding: .1em .5em; text-align: left; }
.muted { color: #777; }
"""

_JS = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("trace-data").textContent);
const longest = Math.max(...DATA.stories.map(s => s.steps.length));
let current = 0;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function colourOf(tenant) {
  return DATA.tenants[tenant] || DATA.other_colour;
}

function legend() {
  const box = document.getElementById("legend");
  for (const [tenant, colour] of Object.entries(DATA.tenants)) {
    const sw = el("span", {class: "swatch"}); sw.style.background = colour;
    box.append(el("span", {}, sw, "tenant " + tenant));
  }
  const other = el("span", {class: "swatch"}); other.style.background = DATA.other_colour;
  box.append(el("span", {}, other, "another tenant's traffic"));
}

function stateAt(story, k) {
  return k === 0 ? story.initial : story.steps[Math.min(k, story.steps.length) - 1].state;
}

function lanes(story, k) {
  const table = el("table", {class: "lanes"});
  const head = el("tr", {}, el("th", {}, "page \\ step"));
  for (let i = 0; i <= story.steps.length; i++) {
    const th = el("th", {class: "col"}, i);
    if (i === k) th.classList.add("current");
    if (i === story.violation_step) th.classList.add("bad-step");
    head.append(th);
  }
  table.append(head);
  const pages = story.initial.pages.length;
  for (let p = 0; p < pages; p++) {
    const row = el("tr", {}, el("th", {}, "page " + p));
    for (let i = 0; i <= story.steps.length; i++) {
      const page = stateAt(story, i).pages[p];
      const td = el("td", {class: "lane-cell", "data-step": i, "data-page": p});
      if (page.content) {
        td.style.background = colourOf(page.content.tenant);
        td.dataset.tenant = page.content.tenant;
        if (page.owner && page.owner.tenant !== page.content.tenant) td.classList.add("mismatch");
      } else if (page.owner) {
        td.classList.add("zeroed");
      } else {
        td.classList.add("empty");
      }
      let title = "step " + i + ", page " + p + ": holds " + page.text;
      if (page.owner) title += "; owned by req " + page.owner.request + " (tenant " +
        page.owner.tenant + ", gen " + page.owner.generation + ")";
      td.title = title;
      if (i === k) td.classList.add("current");
      if (i === story.violation_step) td.classList.add("bad-step");
      row.append(td);
    }
    table.append(row);
  }
  return table;
}

function list(items, empty) {
  if (!items.length) return el("p", {class: "muted"}, empty);
  return el("ul", {}, ...items.map(t => el("li", {}, t)));
}

function requestsTable(state) {
  const t = el("table", {class: "reqs"},
    el("tr", {}, el("th", {}, "request"), el("th", {}, "prefill"), el("th", {}, "decode"),
       el("th", {}, "decode pages"), el("th", {}, "answer")));
  for (const r of state.requests) {
    const name = el("td", {}); const sw = el("span", {class: "swatch"});
    sw.style.background = colourOf(r.tenant); name.append(sw, r.label);
    t.append(el("tr", {"data-request": r.request}, name, el("td", {}, r.prefill),
      el("td", {}, r.decode), el("td", {}, JSON.stringify(r.decode_pages)),
      el("td", {}, r.answer === null ? (r.submitted ? "waiting" : "not sent") : r.answer)));
  }
  return t;
}

function storyView(story, k, idx) {
  const box = el("section", {class: "story", id: "story-" + idx});
  box.append(el("h2", {}, story.title), el("p", {class: "verdict"}, story.verdict));
  const n = Math.min(k, story.steps.length);
  const step = n > 0 ? story.steps[n - 1] : null;
  const heading = el("div", {class: "action " + (step ? step.lane : ""), id: "action-" + idx},
    step ? "step " + step.index + " of " + story.steps.length + ": " + step.text
         : "initial state (" + story.steps.length + " steps follow)");
  box.append(heading);
  if (step && step.violated.length) {
    for (const v of step.violated) {
      box.append(el("div", {class: "violation", id: "violation-" + idx, "data-property": v.name},
        "VIOLATED here: " + v.name + ": " + v.claim));
    }
  } else if (story.violation_step !== null && n > story.violation_step) {
    const bad = story.steps[story.violation_step - 1];
    box.append(el("div", {class: "violation earlier", id: "violation-" + idx},
      "violated since step " + story.violation_step + ": " +
      bad.violated.map(v => v.name).join(", ")));
  }
  box.append(el("h3", {}, "What this step changed"));
  box.append(list(step ? step.changes : [], step ? "nothing visible changed" : "(start)"));
  box.lastChild.id = "changes-" + idx;
  box.append(el("h3", {}, "Decode's pages"), lanes(story, n));
  const state = stateAt(story, n);
  box.append(el("h3", {}, "In flight"));
  const flight = list([...state.messages.map(m => "message: " + m),
                       ...state.writes.map(w => "page " + w),
                       ...state.lost.map(m => "lost (will be retransmitted): " + m)],
                      "nothing in flight");
  flight.id = "messages-" + idx;
  box.append(flight);
  box.append(el("h3", {}, "Requests"), requestsTable(state));
  return box;
}

function show(k) {
  current = Math.max(0, Math.min(longest, k));
  const root = document.getElementById("stories");
  root.replaceChildren(...DATA.stories.map((s, i) => storyView(s, current, i)));
  document.getElementById("slider").value = current;
  document.getElementById("step-index").textContent = "step " + current + " / " + longest;
  document.body.dataset.step = current;
  if (location.hash !== "#step=" + current) history.replaceState(null, "", "#step=" + current);
}

function start() {
  legend();
  const slider = document.getElementById("slider");
  slider.max = longest;
  slider.addEventListener("input", () => show(Number(slider.value)));
  document.getElementById("first").onclick = () => show(0);
  document.getElementById("prev").onclick = () => show(current - 1);
  document.getElementById("next").onclick = () => show(current + 1);
  document.getElementById("last").onclick = () => show(longest);
  document.addEventListener("keydown", e => {
    if (e.key === "ArrowRight") show(current + 1);
    else if (e.key === "ArrowLeft") show(current - 1);
    else if (e.key === "Home") show(0);
    else if (e.key === "End") show(longest);
  });
  const m = /step=(\d+)/.exec(location.hash);
  const bad = DATA.stories[0].violation_step;
  show(m ? Number(m[1]) : (bad === null ? 0 : bad));
}
start();
"""
