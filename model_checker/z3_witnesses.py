"""Every Z3 model shows it can move: its actions fire and its witnesses are reachable.

A safety proof about a model that cannot do anything is worthless: with a transition relation
that never lands a write, every property about written pages holds vacuously (the hand-written
any-size model this project had did exactly that, and still proved the reference SAFE). So each
Z3 engine asks its model, before a `holds` counts, whether

* every action fires: some path from the initial state takes it within `depth` steps;
* every witness (the `can_...` sometimes-properties of `spec/properties.py`) is reachable: the
  witness's formula (`Witness.formula`), read over the model by `logic_z3` / `z3_derived`.

Two models are asked:

* the fixed-configuration encoding (`z3_encoding`, behind bmc, kind, spacer and fixed-config
  prove): one incremental unrolling, and at each depth d one query "some pending action fires at
  step d or some pending witness holds in state d" (repeated while it is satisfiable), so each
  answer's depth is the shortest. Every path found is decoded and replayed through the spec,
  which must take the same actions and reach the same witnesses: a "reached" is a spec fact.
* the any-size model derived from the rules (`z3_derived`, behind any-size prove): the other
  way round, the spec's own paths replayed through the model (`derived_movement`). The spec's
  breadth-first search gives the first edge on which it takes each action kind and the first
  state where each witness holds; every edge of those paths must be a step of the model from
  the abstraction of the state before to that of the state after (the first from the model's
  initial state), with the witness's formula holding where the spec reached it.

What is *expected* comes from the spec, not from a hand-written list: the fixed encoding has an
instance only for actions the spec's design and configuration allow, and an action or witness
that Z3 does not reach within the bound is an error only if the spec's own explorer reaches it
within the same bound on the same configuration (searched only then, and remembered). For the
any-size model, everything the spec takes or reaches within `REPLAY_DEPTH` is asked, and what it
does not is listed as such (`spec_unreached`).

A finding is reported as `vacuity`; the engines then turn their `holds` into `unknown` (exit 3),
never SAFE. A solver `unknown` is a finding too."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from kvhandoff.model_checker.result import CheckResult
from kvhandoff.model_checker.z3_encoding import Encoding, EncodingError, SymState
from kvhandoff.spec.actions import Action, action_name
from kvhandoff.spec.compiled import rules
from kvhandoff.spec.config import Config
from kvhandoff.spec.machine import init
from kvhandoff.spec.properties import SOMETIMES
from kvhandoff.spec.state import State
from kvhandoff.spec.trace import TraceError, replay
from kvhandoff.spec.variants import Variant


@dataclass
class Movement:
    """What a model was shown to do: the step each action fires at and the depth each witness
    holds at (the shortest on the fixed encoding; None: not within `depth`), and the findings."""

    model: str
    depth: int
    actions: dict[str, int | None]
    witnesses: dict[str, int | None]
    problems: list[str] = field(default_factory=list)
    """Vacuity findings: an action or witness the spec reaches that the model does not."""
    not_checked: dict[str, str] = field(default_factory=dict)
    """Witnesses this model cannot express, and why."""
    spec_unreached: list[str] = field(default_factory=list)
    """Actions or witnesses the model does not reach, nor does the spec within the bound."""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "depth": self.depth,
            "actions": dict(self.actions),
            "witnesses": dict(self.witnesses),
            "problems": list(self.problems),
            "not_checked": dict(self.not_checked),
            "spec_unreached": list(self.spec_unreached),
            "seconds": round(self.seconds, 4),
        }

    @property
    def unknown(self) -> bool:
        """Some query came back `unknown` (a timeout, say)."""
        return any("solver unknown" in p for p in self.problems)

    def reached(self) -> dict[str, bool]:
        """The witnesses checked, and whether each was reached (the `CheckResult.witnesses`)."""
        return {name: d is not None for name, d in self.witnesses.items()}


# --- what the spec reaches ------------------------------------------------------------------------


@dataclass
class SpecSearch:
    """The spec's breadth-first search from the initial state, kept as a tree: each state's
    parent and the action that reached it first, the first edge on which each action kind
    fires, and the first state at which each witness holds (by depth)."""

    parent: dict[State, tuple[State, Action] | None]
    fired: dict[str, tuple[int, State, Action, State]]
    """Action kind: (its step, the state before, the action, the state after)."""
    held: dict[str, tuple[int, State]]
    """Witness: (its depth, the first state at that depth where it holds)."""
    depth: int

    def path(self, state: State) -> list[tuple[State, Action, State]]:
        """The tree's edges from the initial state to `state`."""
        out = []
        while (up := self.parent[state]) is not None:
            out.append((up[0], up[1], state))
            state = up[0]
        return out[::-1]


_SPEC_CACHE: dict[tuple[Any, ...], SpecSearch] = {}


def spec_search(
    variant: Variant, config: Config, depth: int, until_witnesses: bool = False
) -> SpecSearch:
    """Breadth-first search of the spec up to `depth` steps; with `until_witnesses`, ended after
    the depth at which the last witness first holds (remembered per variant's rules, config and
    the two arguments: only pure-design variants reach the Z3 engines)."""
    key = (variant.rules_key(), config, depth, until_witnesses)
    if key in _SPEC_CACHE:
        return _SPEC_CACHE[key]
    rulebook = rules(variant)
    enabled_in, effect_of = rulebook.enabled_for(config), rulebook.steps_for(config)
    s0 = init(config)
    parent: dict[State, tuple[State, Action] | None] = {s0: None}
    frontier = [s0]
    fired: dict[str, tuple[int, State, Action, State]] = {}
    held = {w.name: (0, s0) for w in SOMETIMES if w.reached(config, s0)}
    pending = [w for w in SOMETIMES if w.name not in held]
    for d in range(1, depth + 1):
        if until_witnesses and not pending:
            break
        following = []
        for s in frontier:
            for a in enabled_in(config, s):
                t = effect_of[type(a)](config, s, a)
                name = action_name(a)
                if name not in fired:
                    fired[name] = (d, s, a, t)
                if t in parent:
                    continue
                parent[t] = (s, a)
                following.append(t)
                if pending:
                    for w in [w for w in pending if w.reached(config, t)]:
                        held[w.name] = (d, t)
                    pending = [w for w in pending if w.name not in held]
        frontier = following
    out = SpecSearch(parent, fired, held, depth)
    _SPEC_CACHE[key] = out
    return out


def spec_reach(
    variant: Variant, config: Config, depth: int
) -> tuple[dict[str, int], dict[str, int]]:
    """The first step at which each action kind fires and the first depth at which each witness
    holds, in the spec's breadth-first search up to `depth` steps."""
    found = spec_search(variant, config, depth)
    return (
        {n: at[0] for n, at in found.fired.items()},
        {n: at[0] for n, at in found.held.items()},
    )


# --- the fixed-configuration encoding ---------------------------------------------------------------


def fixed_witnesses(enc: Encoding, s: SymState) -> dict[str, Any]:
    """The `SOMETIMES` witnesses of spec/properties.py over one state of the fixed encoding:
    their formulas themselves, read over this encoding (`logic_z3.fixed_witnesses`)."""
    from kvhandoff.model_checker.logic_z3 import fixed_witnesses as derived

    return derived(enc, s)


def _fixed_encoding(variant: Variant, config: Config, depth: int) -> tuple[Encoding, Any]:
    """The narrowest bit-vector encoding whose intervals bound every integer within `depth`
    (as BMC picks it); unbounded Ints where none does."""
    from kvhandoff.model_checker.z3_engines import WIDTHS

    for width in WIDTHS:
        enc = Encoding(variant, config, width=width)
        if enc.narrow(depth, "w_"):
            return enc, z3.SolverFor("QF_BV")
    return Encoding(variant, config, width=None), z3.Solver()


def fixed_movement(
    variant: Variant,
    config: Config,
    depth: int,
    timeout: float | None = None,
) -> Movement:
    """Which actions fire and which witnesses hold within `depth` steps of the fixed encoding
    (see the module docstring); every path found is replayed through the spec."""
    started = time.perf_counter()
    enc, solver = _fixed_encoding(variant, config, depth)
    if timeout is not None:
        solver.set("timeout", max(1, int(timeout * 1000)))
    kinds: dict[str, list[int]] = {}
    for i, inst in enumerate(enc.instances):
        kinds.setdefault(inst.name, []).append(i)
    actions: dict[str, int | None] = dict.fromkeys(kinds)
    witnesses: dict[str, int | None] = {w.name: None for w in SOMETIMES}
    problems: list[str] = []
    solver.add(enc.init(enc.state_at(0, "w_")))
    for name, f in fixed_witnesses(enc, enc.state_at(0, "w_")).items():
        if z3.is_true(z3.simplify(z3.And(enc.init(enc.state_at(0, "w_")), f))):
            witnesses[name] = 0
    reached_depth = depth
    for d in range(1, depth + 1):
        solver.add(enc.trans_at(d - 1, "w_"))
        act = enc.action_at(d - 1, "w_")
        goals = {
            n: z3.Or([act == i for i in ids]) for n, ids in kinds.items() if actions[n] is None
        }
        ws = fixed_witnesses(enc, enc.state_at(d, "w_"))
        goals.update({n: ws[n] for n, at in witnesses.items() if at is None})
        while goals:
            answer = solver.check(z3.Or(list(goals.values())))
            if answer == z3.unknown:
                problems.append(
                    f"solver unknown at depth {d} asking which actions fire and which witnesses "
                    f"hold: {solver.reason_unknown()}"
                )
                reached_depth = d - 1
                break
            if answer == z3.unsat:
                break
            model = solver.model()
            hit = [n for n, g in goals.items() if z3.is_true(model.eval(g, model_completion=True))]
            _replay_fixed(enc, model, d, hit, kinds)
            for n in hit:
                del goals[n]
                if n in actions:
                    actions[n] = d
                else:
                    witnesses[n] = d
        if problems:
            break
        if all(v is not None for v in (*actions.values(), *witnesses.values())):
            break
    out = Movement("fixed-config", depth, actions, witnesses, problems)
    _compare_with_spec(out, variant, config, reached_depth)
    out.seconds = time.perf_counter() - started
    return out


def _replay_fixed(
    enc: Encoding, model: Any, d: int, hit: Sequence[str], kinds: dict[str, list[int]]
) -> None:
    """The path of `model` (d steps) replayed through the spec: the actions `hit` claims fired at
    step d and the witnesses it claims hold at state d must be so in the spec's run."""
    from kvhandoff.model_checker.z3_engines import decode_path

    _vals, path, _states = decode_path(enc, model, d, "w_")
    try:
        states = replay(enc.variant, enc.config, path)
    except TraceError as exc:
        raise EncodingError(f"Z3 path to {', '.join(hit)} does not replay: {exc}") from exc
    by_name = {w.name: w for w in SOMETIMES}
    for n in hit:
        if n in kinds:
            if action_name(path[-1]) != n:
                raise EncodingError(f"Z3 path claims {n} at step {d}, the spec took {path[-1]}")
        elif not by_name[n].reached(enc.config, states[-1]):
            raise EncodingError(
                f"Z3 path claims witness {n} at depth {d}; the spec's state lacks it"
            )


def _compare_with_spec(out: Movement, variant: Variant, config: Config, depth: int) -> None:
    """Findings for what the model missed within `depth` steps but the spec reaches."""
    missed_actions = [n for n, at in out.actions.items() if at is None]
    missed_witnesses = [
        n for n, at in out.witnesses.items() if at is None and n not in out.not_checked
    ]
    if not (missed_actions or missed_witnesses) or depth < 0:
        return
    fired, held = spec_reach(variant, config, depth)
    for n in missed_actions:
        if n in fired:
            out.problems.append(
                f"vacuous {out.model} model: action {n} never fires within {depth} steps, "
                f"but the spec takes it at step {fired[n]} on the same configuration"
            )
        else:
            out.spec_unreached.append(n)
    for n in missed_witnesses:
        if n in held:
            out.problems.append(
                f"vacuous {out.model} model: witness {n} is not reached within {depth} steps, "
                f"but the spec reaches it at depth {held[n]} on the same configuration"
            )
        else:
            out.spec_unreached.append(n)


_FIXED_CACHE: dict[tuple[Any, ...], Movement] = {}


def _code() -> tuple[int, ...]:
    """Identifies the encoding's code, so that an encoding patched at run time (as the tests
    that break one do) is not answered from the cache."""
    return tuple(id(v) for v in vars(Encoding).values())


def _copy(got: Movement) -> Movement:
    return Movement(
        got.model,
        got.depth,
        dict(got.actions),
        dict(got.witnesses),
        list(got.problems),
        dict(got.not_checked),
        list(got.spec_unreached),
        got.seconds,
    )


def fixed_movement_cached(
    variant: Variant, config: Config, depth: int, timeout: float | None = None
) -> Movement:
    """`fixed_movement`, remembered per (design, config, depth): bmc, kind, spacer and
    fixed-config prove all ask it of the same encoding. The timeout only matters to an answer
    with a solver `unknown`, which is asked again."""
    key = (variant.rules_key(), config, depth, _code())
    if key not in _FIXED_CACHE or _FIXED_CACHE[key].unknown:
        _FIXED_CACHE[key] = fixed_movement(variant, config, depth, timeout)
    return _copy(_FIXED_CACHE[key])


# --- what the engines do with it ---------------------------------------------------------------


def with_movement(
    result: CheckResult, variant: Variant, config: Config, depth: int, timeout: float | None
) -> CheckResult:
    """`result` of a fixed-configuration engine, once its encoding has shown it can move within
    `depth` steps: the witnesses checked, and on a finding every property that is not violated
    or unknown becomes unknown (never SAFE). A violated property needs no such check (its trace
    was replayed through the spec), so a result with one is returned as it is."""
    if result.verdict == "violated":
        return result
    movement = fixed_movement_cached(variant, config, depth, timeout)
    apply_movement(result, movement)
    return result


def apply_movement(result: CheckResult, movement: Movement) -> None:
    result.witnesses = movement.reached()
    result.extra["movement"] = movement.to_json()
    if not movement.problems:
        return
    result.extra["vacuity"] = list(movement.problems)
    for r in result.results:
        if r.verdict not in ("violated", "unknown"):
            r.verdict = "unknown"
            r.detail = f"not counted: {movement.problems[0]}"


# --- the derived any-size model -------------------------------------------------------------------


REPLAY_DEPTH = 16
"""How deep the spec's search looks for the paths the derived model must replay (it stops at
the depth where the last witness first holds: 15 on the reference, recovery from a lost
message; every action kind the reference takes fires by step 13)."""


def derived_movement(
    variant: Variant,
    config: Config,
    timeout: float | None = None,
    proved: frozenset[str] = frozenset(),
) -> Movement:
    """Does the derived any-size model (`z3_derived`) move as the spec does? The spec's
    breadth-first search (`spec_search`, at most `REPLAY_DEPTH` steps, ended at the depth where
    the last witness first holds) gives, for every action kind it takes, the first edge that takes it, and for every
    witness the first state where it holds, each with its path from the initial state. Every edge
    of those paths is asked of the model (`Simulator.check_step`): the model's step of that kind
    takes α(before) to α(after) (α(initial) is the model's initial state, and the witness's
    formula, read over the model, holds where the spec reached it). So each action the spec takes
    fires in the model, on the spec's own path, and each witness is reached there.

    A step the model cannot take is a finding (`problems`): the goals on paths through it are
    not reached. An action or witness the spec does not reach within the depth is listed in
    `spec_unreached`, not asked. The proof's claims are not assumed (`proved` is unused here:
    the path's states are the spec's own). One solver query per distinct edge, its terms built
    once per state and action: about 35 queries on the reference, where the unrolling this
    replaced (deleted after 8a0133f; its slow differential test against this replay had passed)
    searched ten steps of every action at once."""
    from kvhandoff.model_checker import z3_derived as zd
    from kvhandoff.model_checker.logic_z3 import Untranslatable

    del proved  # the replayed states are the spec's: no claim is assumed of them
    started = time.perf_counter()
    names = zd.actions(variant.design, variant)
    sim = zd.Simulator(variant.design, config, variant)
    sim.with_claims = False
    formulas: dict[str, Any] = {}
    not_checked: dict[str, str] = {}
    for w in SOMETIMES:
        if w.formula is None:
            not_checked[w.name] = "no formula"
            continue
        try:
            sim.model.tr(w.formula, sim._before, "", {})
        except Untranslatable as exc:
            not_checked[w.name] = str(exc)
            continue
        formulas[w.name] = w.formula
    found = spec_search(variant, config, REPLAY_DEPTH, until_witnesses=True)
    # Each goal's path: a witness's to the state where it first holds; an action's, the first
    # edge that takes it on a witness's path if one does (fewer edges to ask), else the first
    # edge the search took it on.
    goals: dict[str, list[tuple[State, Action, State]]] = {}
    for witness, (_d, where) in found.held.items():
        if witness in formulas and found.parent.get(where) is not None:
            goals[witness] = found.path(where)
    on_paths = [e for path in goals.values() for e in path]
    for name in names:
        if name not in found.fired:
            continue
        _d, before, action, after = found.fired[name]
        edge = next((e for e in on_paths if action_name(e[1]) == name), None)
        if edge is None:
            goals[name] = [*found.path(before), (before, action, after)]
        else:
            goals[name] = found.path(edge[2])
    holds_at: dict[tuple[State, Action], list[str]] = {}
    for goal in formulas:
        if goals.get(goal):
            last = goals[goal][-1]
            holds_at.setdefault((last[0], last[1]), []).append(goal)
    s0 = init(config)
    failed: dict[tuple[State, Action], str] = {}
    passed: set[tuple[State, Action]] = set()
    problems: list[str] = []
    for path in goals.values():
        for before, action, after in path:
            if (before, action) in failed or (before, action) in passed:
                continue
            with_w = holds_at.get((before, action), [])
            why = sim.check_step(
                before,
                action,
                after,
                initial=before == s0,
                holds_after=[sim.after(action, formulas[g]) for g in with_w],
            )
            if why is not None and with_w:
                if sim.check_step(before, action, after, initial=before == s0) is None:
                    why = f"witness {', '.join(with_w)} does not hold where the spec reaches it"
            if why is None:
                passed.add((before, action))
                continue
            failed[(before, action)] = why
            if "solver answered unknown" in why:
                problems.append(f"solver unknown on the derived any-size model: {why}")
    actions: dict[str, int | None] = dict.fromkeys(names)
    witnesses: dict[str, int | None] = {w.name: None for w in SOMETIMES if w.name in formulas}
    spec_unreached = [n for n in [*names, *formulas] if n not in goals]
    for goal, path in goals.items():
        broken = [(b, a) for b, a, _t in path if (b, a) in failed]
        if broken:
            b, a = broken[0]
            step_at = len(found.path(b)) + 1
            problems.append(
                f"vacuous derived any-size model: {goal} is not reached on the spec's path to it: "
                f"step {step_at} ({action_name(a)}) is not a step of the model: {failed[(b, a)]}"
            )
            continue
        if goal in actions:
            actions[goal] = len(path)
        else:
            witnesses[goal] = len(path)
    out = Movement(
        "derived any-size", REPLAY_DEPTH, actions, witnesses, problems, not_checked, spec_unreached
    )
    out.seconds = time.perf_counter() - started
    return out


_DERIVED_CACHE: dict[tuple[Any, ...], Movement] = {}


def derived_movement_cached(
    variant: Variant,
    config: Config,
    timeout: float | None = None,
    proved: frozenset[str] = frozenset(),
) -> Movement:
    """`derived_movement`, remembered per (variant's rules, config); asked again after an
    `unknown`."""
    from kvhandoff.model_checker import z3_derived as zd

    key = (variant.rules_key(), config, proved, id(zd.step))  # a patched model is asked anew
    if key not in _DERIVED_CACHE or _DERIVED_CACHE[key].unknown:
        _DERIVED_CACHE[key] = derived_movement(variant, config, timeout, proved)
    return _copy(_DERIVED_CACHE[key])
