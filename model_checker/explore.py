"""Exhaustive breadth-first search of the spec's state graph.

Every reachable state is visited once, in breadth-first order, so the first state found that breaks
an `always` property ends a shortest counterexample. Every counterexample is replayed through
`spec.step` (with guards checked) before it is reported.

Among the shortest counterexamples, the one with the fewest fault steps is reported: a reader
should not have to wonder what a crash or a lost message has to do with a bug that needs neither.
The search counts the faults on each state's path (`faults_on_path`); a state reached at the same
depth from a parent with fewer faults takes that parent, and a property already broken by a state
whose path has faults is checked again on the later states of that same depth that have fewer,
keeping the first that breaks it. (In the spec a state's fault budget already counts its faults,
so the parent rule matters only for variants whose own steps skip the count; the second rule is
what turns "a cancel, then the bug" into the bug alone when both are as short.)

`every_request_terminates` is checked on the graph of *protocol* edges (fault actions removed):
from every reachable state, whatever faults happened before, the protocol on its own must bring
every request to an end. A state with no protocol step left that is not done ("stuck"), or a cycle
of protocol steps among states that are not done, breaks it; otherwise the bound is the longest
protocol-only path to a done state, reported as `response_bound`.

Two reductions, on by default (`reduce=False` turns them off), each merging states that differ only
in what no step and no property reads: the ghost flags that only witnesses read ("a freed page
was reused", "a cancel came mid-transfer"), which are stored cleared and asked by those witnesses
on the step that sets one; and prefill's side of a request prefill has finished with (the grant
it held, the prompt length it admitted), stored as initial (`model_checker/reduction.py`: why
the verdicts, the safety counterexamples, the witnesses and the termination bound are those of
the full search; 102,744 states for the reference on the default scenario where the full search
has 257,024). No symmetry reduction:
decode's pages look interchangeable, but two rules read their order (lowest free pages first; a
grant written in page order), so states equal up to a page relabelling can behave differently,
and keeping one per class changed the incident's shortest counterexample (see
`spec/symmetry.py`, benchmarks/results/symmetry.txt).
"""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import networkx as nx

from kvhandoff.model_checker import progress
from kvhandoff.model_checker.reduction import (
    Eraser,
    erasable_ghost_flags,
    erasable_prefill_fields,
    flag_witnesses,
)
from kvhandoff.model_checker.result import CheckResult, PropertyResult, Verdict
from kvhandoff.spec.actions import Action, action_name, is_fault
from kvhandoff.spec.compiled import rules
from kvhandoff.spec.config import Config, placements
from kvhandoff.spec.invariants import Invariant, invariants_for
from kvhandoff.spec.machine import enabled, init, step
from kvhandoff.spec.properties import ALWAYS, DEPLOYMENT, SOMETIMES, TERMINATION
from kvhandoff.spec.state import (
    PREFILL_TERMINAL,
    Faults,
    Ghost,
    PageState,
    ReqState,
    State,
    all_done,
    evolved,
)
from kvhandoff.spec.trace import replay
from kvhandoff.spec.variants import Variant


@dataclass
class StateGraph:
    """The explored graph: states by index, BFS parents, and protocol-only successors."""

    states: list[State]
    parent: list[int]
    via: list[Action | None]
    faults_on_path: list[int]
    protocol_succ: list[list[int]]
    all_edges: list[list[tuple[int, Action]]] | None
    depth_of: list[int]
    transitions: int
    complete: bool
    invariant_failures: dict[str, int] | None = None
    """With `invariants=True`: the first state (by index) breaking each invariant of
    `spec/invariants.py` that some reachable state breaks."""
    property_disagreements: dict[str, int] | None = None
    """With `invariants=True`: the first state (by index) where the formula of an `always`
    property (what the Z3 engines check) and its Python function (what the search checks)
    disagree; empty unless one of the two is wrong."""
    witness_disagreements: dict[str, int] | None = None
    """The same for the `sometimes` witnesses: the first state where a witness's formula (what
    the Z3 engines search for) and its Python function disagree."""
    cleared: tuple[str, ...] = ()
    """The ghost flags cleared in every stored state (`model_checker/reduction.py`): empty
    unless the search was asked to `reduce`."""
    erased: tuple[str, ...] = ()
    """The prefill fields cleared of every request prefill has finished with, in every stored
    state (`model_checker/reduction.py`): empty unless the search was asked to `reduce`."""

    def stored(self, state: State) -> State:
        """`state` as the search stores it (its cleared flags and fields cleared)."""
        if self.cleared or self.erased:
            return Eraser(self.cleared, self.erased).state(state)
        return state

    def path_to(self, index: int) -> tuple[Action, ...]:
        actions: list[Action] = []
        while self.parent[index] >= 0:
            action = self.via[index]
            assert action is not None
            actions.append(action)
            index = self.parent[index]
        return tuple(reversed(actions))

    def to_networkx(self) -> Any:
        """The full graph (requires `keep_edges=True`), edges labelled with action names."""
        if self.all_edges is None:
            raise ValueError("explore with keep_edges=True to build the full graph")
        g: Any = nx.DiGraph()
        g.add_nodes_from(range(len(self.states)))
        for i, edges in enumerate(self.all_edges):
            for j, action in edges:
                g.add_edge(i, j, action=action_name(action), fault=is_fault(action))
        return g


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector.

    The search allocates millions of small objects and keeps most of them, none in a reference
    cycle (states are trees of frozen values): the collector's passes walk every live state and
    find nothing. Reference counting still frees everything the search drops. At the end, what
    the search allocated is handed to the oldest generation unwalked (see below)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if not gc.get_freeze_count():
            # What the search allocated is still in the youngest generation, and the first
            # collection after the pause would walk all of it (a few percent of the search)
            # only to find it alive. Freezing and at once unfreezing moves every tracked
            # object to the oldest generation without walking any. Not done when the program
            # froze objects of its own (`gc.freeze`): unfreezing would let go of those too.
            gc.freeze()
            gc.unfreeze()
        if was_enabled:
            gc.enable()


class _Shared:
    """One object for each distinct request state, page state, ghost record and fault count of
    the stored states.

    Looking a successor up compares it with the stored state of equal hash, field by field; fields
    that are the same object compare at once. A successor shares every part its step left alone
    with the stored state it was stepped from, so making the stored states share equal parts with
    each other leaves only what the step changed to compare.
    """

    def __init__(self) -> None:
        self.requests: dict[ReqState, ReqState] = {}
        self.pages: dict[PageState, PageState] = {}
        self.ghosts: dict[Ghost, Ghost] = {}
        self.faults: dict[Faults, Faults] = {}

    def adopt(self, t: State, parent: State) -> State:
        """`t` (a new state, not yet stored) with the parts that differ from `parent`'s
        replaced by equal ones already stored: an equal state."""
        changes: dict[str, Any] = {}
        if t.requests is not parent.requests:
            setdefault = self.requests.setdefault
            changes["requests"] = tuple(map(setdefault, t.requests, t.requests))
        if t.pages is not parent.pages:
            setdefault_page = self.pages.setdefault
            changes["pages"] = tuple(map(setdefault_page, t.pages, t.pages))
        if t.ghost is not parent.ghost:
            changes["ghost"] = self.ghosts.setdefault(t.ghost, t.ghost)
        if t.faults is not parent.faults:
            changes["faults"] = self.faults.setdefault(t.faults, t.faults)
        return evolved(t, changes) if changes else t


def invariants_of(variant: Variant) -> tuple[Invariant, ...]:
    """The invariants the proof of this design uses (`spec.invariants.invariants_for`: room-keyed
    matching has its own versions of two, the one-sided designs have one more)."""
    return invariants_for(variant.design)


def build_graph(
    variant: Variant,
    config: Config,
    max_states: int | None = None,
    keep_edges: bool = False,
    invariants: bool = False,
    reduce: bool = False,
) -> tuple[StateGraph, dict[str, int], dict[str, bool]]:
    """Breadth-first search. Returns the graph, the index of the first state violating each
    `always` property, and which witnesses were reached. With `invariants`, it also evaluates
    every invariant of `spec/invariants.py` (the formulas kind and prove use) on every state,
    and every property's and witness's formula beside its Python function. With `reduce`, the
    states are stored with the ghost flags only witnesses read cleared, and the prefill fields
    nothing reads of a finished request (`model_checker/reduction.py`): the same verdicts,
    counterexamples and witnesses, fewer states; the graph's states are then those cleared
    states."""
    with _cyclic_gc_paused():
        return _search(variant, config, max_states, keep_edges, invariants, reduce)


def _search(
    variant: Variant,
    config: Config,
    max_states: int | None,
    keep_edges: bool,
    check_invariants: bool = False,
    reduce: bool = False,
) -> tuple[StateGraph, dict[str, int], dict[str, bool]]:
    checked = invariants_of(variant) if check_invariants else ()
    # The ghost flags only witnesses read (`model_checker/reduction.py`): each stored state has
    # them cleared, and the witnesses that read them are asked on the step that sets one. Not
    # with `check_invariants`: that mode compares every formula with its Python function on
    # every reachable state, and a cleared state is not always one.
    cleared = erasable_ghost_flags(variant) if reduce and not check_invariants else ()
    # And the prefill fields nothing reads of a request prefill has finished with, cleared of
    # each such request.
    erased = erasable_prefill_fields(variant, config) if reduce and not check_invariants else ()
    eraser = Eraser(cleared, erased) if cleared or erased else None
    flag_watch = list(flag_witnesses(cleared)) if cleared else []
    s0 = init(config)
    index: dict[State, int] = {s0: 0}
    states = [s0]
    parent = [-1]
    via: list[Action | None] = [None]
    faults_on_path = [0]
    depth_of = [0]
    protocol_succ: list[list[int]] = []
    all_edges: list[list[tuple[int, Action]]] | None = [] if keep_edges else None
    first_violation: dict[str, int] = {}
    witnesses = {w.name: False for w in SOMETIMES}
    pending_witnesses = list(SOMETIMES)
    always = list(ALWAYS)
    transitions = 0
    complete = True
    shared = _Shared()

    # Properties broken at their shortest depth by a state with faults on its path: the later
    # states of that depth with fewer faults may break them too (see the module docstring).
    improvable: list[Any] = []

    drain = variant.design.drain_fenced
    invariant_failures: dict[str, int] = {}
    unbroken = [(inv.name, inv.compiled()) for inv in checked]
    disagreements: dict[str, int] = {}
    # Each property's formula beside its Python function, on every state, until they disagree.
    compared = [p for p in ALWAYS if p.formula is not None] if check_invariants else []
    witness_disagreements: dict[str, int] = {}
    compared_witnesses = [w for w in SOMETIMES if w.formula is not None] if check_invariants else []

    def inspect(i: int, s: State) -> None:
        nonlocal pending_witnesses, improvable, unbroken, compared, compared_witnesses
        if unbroken and not all(holds(s, config, drain) for _, holds in unbroken):
            for name, holds in unbroken:
                if not holds(s, config, drain):
                    invariant_failures[name] = i
            unbroken = [(n, h) for n, h in unbroken if n not in invariant_failures]
        if compared:
            for prop in compared:
                if prop.formula_holds(config, s) != prop.holds(config, s):
                    disagreements[prop.name] = i
            compared = [p for p in compared if p.name not in disagreements]
        if compared_witnesses:
            for w in compared_witnesses:
                if w.formula_holds(config, s) != w.reached(config, s):
                    witness_disagreements[w.name] = i
            compared_witnesses = [
                w for w in compared_witnesses if w.name not in witness_disagreements
            ]
        if not claims_hold(s) or not whole_hold(s):
            for prop in always:
                if prop.name not in first_violation and not prop.holds(config, s):
                    first_violation[prop.name] = i
                    if faults_on_path[i]:
                        improvable.append(prop)
        if improvable:
            improvable = [p for p in improvable if _improve(p, i, s)]
        if pending_witnesses:
            reached = [w for w in pending_witnesses if w.reached(config, s)]
            if reached:
                for w in reached:
                    witnesses[w.name] = True
                pending_witnesses = [w for w in pending_witnesses if not witnesses[w.name]]

    # The properties that are a claim about each request (page) on its own (`each_request`,
    # `each_page`: `holds` is that claim for every request, page) are evaluated once per
    # distinct request (page) state, which the stored states share (`_Shared`): a state whose
    # requests and pages all satisfy every such claim satisfies those properties, and only the
    # others (`whole`) are asked. Otherwise every property is asked, as it is stated.
    per_request = tuple(p.each_request for p in ALWAYS if p.each_request is not None)
    per_page = tuple(p.each_page for p in ALWAYS if p.each_page is not None)
    whole = [p for p in ALWAYS if p.each_request is None and p.each_page is None]
    request_claims: list[dict[ReqState, bool]] = [{} for _ in s0.requests]
    page_claims: dict[PageState, bool] = {}
    # The same answers, where they are yes, by the identity of the request (page) object: the
    # ids of the parts of stored states, which stay alive as long as the search, so an id names
    # one object throughout. Most states are made of parts already known good, and looking
    # their ids up, in C, asks no part for its hash.
    good_requests: list[set[int]] = [set() for _ in s0.requests]
    good_pages: set[int] = set()
    known_good, page_known_good = set.__contains__, good_pages.__contains__

    def claims_hold(s: State) -> bool:
        requests, pages = s.requests, s.pages
        if all(map(known_good, good_requests, map(id, requests))) and all(
            map(page_known_good, map(id, pages))
        ):
            return True
        for r, req in enumerate(requests):
            known = request_claims[r].get(req)
            if known is None:
                known = request_claims[r][req] = all(c(config, r, req) for c in per_request)
            if not known:
                return False
            good_requests[r].add(id(req))
        for page in pages:
            known = page_claims.get(page)
            if known is None:
                known = page_claims[page] = all(c(config, page) for c in per_page)
            if not known:
                return False
            good_pages.add(id(page))
        return True

    # A whole-state property that reads only requests and pages (`Property.reads`) is answered
    # once per combination of request and page objects, by their ids as above: states that
    # differ only in messages, writes, epochs or faults share those objects (on the default
    # scenario, about one stored state in nine is a new combination).
    def _of_parts(p: Any) -> bool:
        return bool(p.reads) and all(r.partition(".")[0] in ("requests", "pages") for r in p.reads)

    parts_holds = tuple(p.holds for p in whole if _of_parts(p))
    whole_holds = tuple(p.holds for p in whole if not _of_parts(p))
    parts_verdicts: dict[tuple[int, ...], bool] = {}

    def whole_hold(s: State) -> bool:
        for holds in whole_holds:
            if not holds(config, s):
                return False
        if parts_holds:
            key = (*map(id, s.requests), *map(id, s.pages))
            known = parts_verdicts.get(key)
            if known is None:
                known = parts_verdicts[key] = all(h(config, s) for h in parts_holds)
            return known
        return True

    def _improve(prop: Any, i: int, s: State) -> bool:
        """Take state i as prop's counterexample if it is as short with fewer faults; True while
        a better one may still come."""
        best = first_violation[prop.name]
        if depth_of[i] != depth_of[best]:
            return False  # past that depth: nothing shorter or as short remains
        if faults_on_path[i] < faults_on_path[best] and not prop.holds(config, s):
            first_violation[prop.name] = i
            return faults_on_path[i] > 0
        return True

    inspect(0, s0)
    head = 0
    # The variant's compiled rules, looked up once: `enabled` and `step` without the dispatch.
    rulebook = rules(variant)
    enabled_in, effect_of = rulebook.enabled_for(config), rulebook.steps_for(config, True)
    index_get, adopt = index.get, shared.adopt
    # Whether an action is a fault depends on its kind alone (`is_fault`): asked once per kind.
    fault_kind: dict[type, bool] = {}
    stored = len(states)  # len(states), kept as the loop appends
    while head < stored:
        if not head & 1023:  # often enough for Ctrl-C to report a recent count
            progress.report("explore", states=stored, depth=depth_of[head], transitions=transitions)
        s = states[head]
        succ: list[int] = []
        edges: list[tuple[int, Action]] = []
        depth = depth_of[head] + 1
        spent = faults_on_path[head]
        actions = enabled_in(config, s)
        transitions += len(actions)
        for action in actions:
            kind = type(action)
            t = effect_of[kind](config, s, action)
            if eraser is not None:
                if cleared and t.ghost is not s.ghost:
                    # A step that set a ghost flag: the witnesses reading cleared flags are
                    # asked here, on the state as the step left it, and then the flags are
                    # cleared.
                    if flag_watch:
                        for w in [w for w in flag_watch if w.reached(config, t)]:
                            witnesses[w.name] = True
                            flag_watch.remove(w)
                            pending_witnesses = [p for p in pending_witnesses if p is not w]
                    t = eraser.without_flags(t)
                if erased and t.requests is not s.requests:
                    t = eraser.requests(t, s)
            fault = fault_kind.get(kind)
            if fault is None:
                fault = fault_kind[kind] = is_fault(action)
            j = index_get(t)
            if j is None:
                if max_states is not None and stored >= max_states:
                    complete = False
                    continue
                # Stored with its parts shared with the stored states' (the index keeps the key
                # it is given).
                j = stored
                t = adopt(t, s)
                index[t] = j
                states.append(t)
                stored += 1
                parent.append(head)
                via.append(action)
                faults_on_path.append(spent + fault)
                depth_of.append(depth)
                inspect(j, t)
            elif depth_of[j] == depth and spent + fault < faults_on_path[j]:
                # As short a path to t, with fewer faults: t's path runs through this parent.
                parent[j] = head
                via[j] = action
                faults_on_path[j] = spent + fault
            if not fault:
                succ.append(j)
            if all_edges is not None:
                edges.append((j, action))
        protocol_succ.append(succ)
        if all_edges is not None:
            all_edges.append(edges)
        head += 1
    progress.report("explore", states=len(states), depth=max(depth_of), transitions=transitions)
    graph = StateGraph(
        states,
        parent,
        via,
        faults_on_path,
        protocol_succ,
        all_edges,
        depth_of,
        transitions,
        complete,
        invariant_failures if check_invariants else None,
        disagreements if check_invariants else None,
        witness_disagreements if check_invariants else None,
        cleared,
        erased,
    )
    return graph, first_violation, witnesses


def _termination(variant: Variant, config: Config, graph: StateGraph) -> tuple[PropertyResult, int]:
    """Bounded response on the protocol-only graph; returns the result and the measured bound."""
    n = len(graph.states)
    done = [all_done(config, s) for s in graph.states]
    # longest[i]: most protocol steps from i to a done state; -1 while unknown.
    longest = [0 if done[i] else -1 for i in range(n)]
    on_stack = [False] * n
    for root in range(n):
        if longest[root] >= 0:
            continue
        # Iterative depth-first search; a back edge to a node on the stack is a protocol cycle.
        stack: list[tuple[int, Iterator[int]]] = [(root, iter(graph.protocol_succ[root]))]
        on_stack[root] = True
        trail = [root]
        while stack:
            node, children = stack[-1]
            advanced = False
            for child in children:
                if longest[child] >= 0:
                    continue
                if on_stack[child]:
                    cycle_at = trail.index(child)
                    prefix = graph.path_to(trail[0])
                    loop = _steps_along(variant, config, graph, [*trail[cycle_at:], child])
                    between = _steps_along(variant, config, graph, trail[: cycle_at + 1])
                    trace = prefix + between + loop
                    return (
                        PropertyResult(
                            TERMINATION.name,
                            "violated",
                            depth=len(trace),
                            trace=trace,
                            loop_start=len(prefix) + len(between),
                            detail="a cycle of protocol steps that never ends every request",
                        ),
                        -1,
                    )
                on_stack[child] = True
                stack.append((child, iter(graph.protocol_succ[child])))
                trail.append(child)
                advanced = True
                break
            if advanced:
                continue
            stack.pop()
            trail.pop()
            on_stack[node] = False
            succ = graph.protocol_succ[node]
            if not succ:
                trace = graph.path_to(node)
                return (
                    PropertyResult(
                        TERMINATION.name,
                        "violated",
                        depth=len(trace),
                        trace=trace,
                        detail=_stuck_detail(config, graph.states[node]),
                    ),
                    -1,
                )
            longest[node] = 1 + max(map(longest.__getitem__, succ))
    bound = max(longest) if longest else 0
    if config.response_bound and bound > config.response_bound:
        worst = longest.index(bound)
        trace = graph.path_to(worst)
        return (
            PropertyResult(
                TERMINATION.name,
                "violated",
                depth=len(trace),
                trace=trace,
                detail=f"{bound} protocol steps to end every request; the bound is "
                f"{config.response_bound}",
            ),
            bound,
        )
    return PropertyResult(TERMINATION.name, "holds", depth=bound), bound


def _steps_along(
    variant: Variant, config: Config, graph: StateGraph, nodes: list[int]
) -> tuple[Action, ...]:
    """The protocol actions that lead from each node to the next along `nodes`.

    Edges are not stored with their actions (memory), so each is found again from the spec.
    """
    out: list[Action] = []
    for a, b in itertools.pairwise(nodes):
        source, target = graph.states[a], graph.states[b]
        for action in enabled(variant, config, source):
            if (
                not is_fault(action)
                and graph.stored(step(variant, config, source, action)) == target
            ):
                out.append(action)
                break
        else:
            raise AssertionError(f"no protocol edge from state {a} to state {b}")
    return tuple(out)


def _stuck_detail(config: Config, state: State) -> str:
    waiting = []
    for r, req in enumerate(state.requests):
        if not req.submitted:
            continue
        parts = []
        if req.answer is None:
            parts.append("no answer")
        if req.p not in PREFILL_TERMINAL:
            parts.append(f"prefill {req.p}")
        if req.d_pages:
            parts.append(f"decode {req.d} holding pages {list(req.d_pages)}")
        if parts:
            waiting.append(f"request {r}: " + ", ".join(parts))
    if state.orphans:
        # (room, generation), and the prefill instance holding it where there are several.
        held = [o if any(i for _, _, i in state.orphans) else o[:2] for o in state.orphans]
        waiting.append(f"prefill holds orphan transfer state {held}")
    return "stuck: no protocol step is enabled, but " + "; ".join(waiting)


def explore(
    variant: Variant,
    config: Config,
    max_states: int | None = None,
    invariants: bool = False,
    reduce: bool = True,
) -> CheckResult:
    """Check every property of `variant` on `config` by exhaustive search; with `invariants`,
    also evaluate the proof's invariants, and the formulas of the properties and witnesses
    (what the Z3 engines check) beside their Python functions, on every state
    (`extra["invariants"]`).

    Where the router places requests as it likes on several instances (`placement="any"`), or
    clients choose the rooms (`rooms="any"`), each fixed choice is searched
    (`spec.config.placements`: every run of such a router or such clients is a run of one of
    them). A violation is reported from the placement with the shortest
    counterexample, with that placement's configuration (what its trace replays on); otherwise
    the placements' results are one: a property holds when it holds on every placement, a
    witness is reached when some placement reaches it, and the states are the placements'
    together. `extra["placements"]` lists each placement's own verdict.

    With `reduce` (the default), states that differ only in ghost flags no guard, effect or
    `always` property reads, or in prefill fields nothing reads of a request prefill has
    finished with, are one (`model_checker/reduction.py`: the same verdicts, counterexamples and
    witnesses); `states` counts them once, and `extra["cleared_flags"]` and
    `extra["cleared_fields"]` name what was cleared. `reduce=False` counts every state, and so does `invariants` (it compares
    formulas with their Python functions on every reachable state)."""
    fixed = placements(config)
    if len(fixed) == 1 and fixed[0] is config:
        return _explore_one(variant, config, max_states, invariants, reduce)
    runs = [_explore_one(variant, c, max_states, invariants, reduce) for c in fixed]
    return union_of_placements(config, runs)


def placement_text(config: Config, rooms: bool = False) -> str:
    """Where `config` places its requests, `0:a:p0/d1, 1:b:p0/d0`, by request and tenant; with
    `rooms`, each request's room too (`0:a:room 1, 1:b:room 1`), and the placement only where
    there are several instances."""
    several = config.prefill_instances > 1 or config.decode_instances > 1
    items = []
    for i, r in enumerate(config.requests):
        item = f"{i}:{r.tenant}"
        if rooms:
            item += f":room {r.room}"
        if several or not rooms:
            item += f":p{r.prefill_instance}/d{r.decode_instance}"
        items.append(item)
    return ", ".join(items)


def union_of_placements(config: Config, runs: list[CheckResult]) -> CheckResult:
    """One result for a router that may place requests anywhere, or clients that choose rooms
    (`config`), from each fixed choice's (any engine's: see `explore`)."""

    def severity(run: CheckResult) -> tuple[int, int]:
        depths = [r.depth or 0 for r in run.results if r.verdict == "violated"]
        order = {"violated": 0, "unknown": 1, "bounded": 2, "safe": 3}[run.verdict]
        return order, min(depths, default=0)

    worst = min(runs, key=severity)
    witnesses = {
        name: any(run.witnesses.get(name, False) for run in runs) for name in worst.witnesses
    }
    counted = [run.states for run in runs if run.states is not None]
    states = sum(counted) if counted else None  # the Z3 engines count no states
    seconds = sum(run.seconds for run in runs)
    summary = [
        {
            "placement": placement_text(run.config, rooms=config.rooms == "any"),
            "verdict": run.verdict,
            "states": run.states,
        }
        for run in runs
    ]
    extra = dict(worst.extra)
    extra["placements"] = summary
    extra["rooms_chosen"] = config.rooms == "any"
    if all("transitions" in run.extra for run in runs):  # the explorer's figures
        extra.update(
            transitions=sum(run.extra["transitions"] for run in runs),
            max_depth=max(run.extra["max_depth"] for run in runs),
            complete=all(run.extra["complete"] for run in runs),
            states_per_second=round((states or 0) / seconds) if seconds > 0 else None,
        )
    if worst.verdict in ("violated", "unknown"):
        # The counterexample (or the limit reached) is that placement's: its configuration is
        # the one its trace replays on.
        scope, results = worst.config, worst.results
    else:
        scope = config
        if "response_bound" in extra:
            bounds = [run.extra.get("response_bound") for run in runs]
            extra["response_bound"] = None if None in bounds else max(b or 0 for b in bounds)
        results = [
            PropertyResult(
                r.property,
                # `bounded` on some placement (and nothing worse anywhere): bounded.
                "bounded"
                if any(run.results[i].verdict == "bounded" for run in runs)
                else r.verdict,
                depth=min((run.results[i].depth or 0) for run in runs)
                if r.verdict == "bounded"
                else max((run.results[i].depth or 0) for run in runs),
                detail=r.detail,
            )
            for i, r in enumerate(worst.results)
        ]
    return CheckResult(
        variant=worst.variant,
        engine=worst.engine,
        config=scope,
        results=results,
        witnesses=witnesses,
        states=states,
        seconds=seconds,
        extra=extra,
    )


def _explore_one(
    variant: Variant, config: Config, max_states: int | None, invariants: bool, reduce: bool
) -> CheckResult:
    """`explore` on one fixed placement."""
    started = time.perf_counter()
    graph, first_violation, witnesses = build_graph(
        variant, config, max_states, invariants=invariants, reduce=reduce
    )
    results: list[PropertyResult] = []
    for prop in ALWAYS:
        i = first_violation.get(prop.name)
        if i is None:
            verdict: Verdict = "holds" if graph.complete else "unknown"
            results.append(PropertyResult(prop.name, verdict, depth=max(graph.depth_of)))
            continue
        trace = graph.path_to(i)
        final = replay(variant, config, trace)[-1]
        if prop.holds(config, final):
            raise AssertionError(f"counterexample for {prop.name} does not replay to a violation")
        results.append(PropertyResult(prop.name, "violated", depth=len(trace), trace=trace))
    bound = None
    if graph.complete:
        term, measured = _termination(variant, config, graph)
        if term.trace is not None:
            replay(variant, config, term.trace)
        bound = measured if measured >= 0 else None
        results.append(term)
    else:
        results.append(PropertyResult(TERMINATION.name, "unknown", detail="state limit reached"))
    seconds = time.perf_counter() - started
    extra_invariants: dict[str, Any] = {}
    if graph.invariant_failures is not None:
        extra_invariants["invariants"] = {
            "checked": [inv.name for inv in invariants_of(variant)],
            "failing": {
                name: {
                    "depth": graph.depth_of[i],
                    "trace": [action_name(a) for a in graph.path_to(i)],
                }
                for name, i in sorted(graph.invariant_failures.items())
            },
            # The formulas of the `always` properties, evaluated beside the Python functions.
            "properties": {
                "checked": [p.name for p in ALWAYS if p.formula is not None],
                "disagreeing": {
                    name: {
                        "depth": graph.depth_of[i],
                        "trace": [action_name(a) for a in graph.path_to(i)],
                    }
                    for name, i in sorted((graph.property_disagreements or {}).items())
                },
            },
            # The same for the formulas of the `sometimes` witnesses.
            "witnesses": {
                "checked": [w.name for w in SOMETIMES if w.formula is not None],
                "disagreeing": {
                    name: {
                        "depth": graph.depth_of[i],
                        "trace": [action_name(a) for a in graph.path_to(i)],
                    }
                    for name, i in sorted((graph.witness_disagreements or {}).items())
                },
            },
        }
    return CheckResult(
        variant=variant.name,
        engine="explore",
        config=config,
        results=results,
        witnesses=witnesses,
        states=len(graph.states),
        seconds=seconds,
        extra={
            "transitions": graph.transitions,
            "max_depth": max(graph.depth_of),
            "complete": graph.complete,
            "response_bound": bound,
            "states_per_second": round(len(graph.states) / seconds) if seconds > 0 else None,
            "deployment": {name: check(config) for name, check in DEPLOYMENT},
            "expected_breaks": list(variant.breaks),
            "cleared_flags": list(graph.cleared),
            "cleared_fields": list(graph.erased),
            **extra_invariants,
        },
    )


def to_dot(graph: StateGraph, variant: Variant, config: Config) -> str:
    """Graphviz DOT of an explored graph (small configs), fault edges dashed, done states boxed."""
    g = graph.to_networkx()
    lines = ["digraph kvhandoff {", "  rankdir=LR; node [shape=circle, fontsize=8];"]
    for i in g.nodes:
        shape = "box" if all_done(config, graph.states[i]) else "circle"
        bad = any(not p.holds(config, graph.states[i]) for p in ALWAYS)
        color = ', color=red, style=filled, fillcolor="#ffdddd"' if bad else ""
        lines.append(f"  s{i} [label={i}, shape={shape}{color}];")
    for a, b, data in g.edges(data=True):
        style = ", style=dashed" if data["fault"] else ""
        lines.append(f'  s{a} -> s{b} [label="{data["action"]}", fontsize=6{style}];')
    lines.append("}")
    return "\n".join(lines) + "\n"
