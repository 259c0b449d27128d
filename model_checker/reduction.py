"""Ghost flags that only witnesses read: merged away by the explorer.

The spec keeps a few whole-system ghost flags (`spec.state.Ghost`): "a freed page was granted
again", "a cancel came in mid-transfer", "an answer was ok after a crash". Each is set, once and
for good, by the step that makes it true, and read by a `sometimes` witness ("this design can
reuse a freed page": not vacuous). No guard reads them and no effect computes anything from
them, and the `always` properties (but `no_late_write_lands_in_reallocated_page`, which reads
`late_landing`) do not read them either. Yet each is part of the state, so two states that differ
in such a flag alone are two states to the search, with the same future: after the first page
reuse, every state of the rest of the run is there twice, with the flag set and without.

The explorer therefore stores each state with these flags cleared (`erase`), and looks at the
flags only where they matter: on the step that sets one, before clearing it, it asks the witnesses
that read it. That search is exact for everything it reports:

* **The same behaviours.** Guards and effects read none of the cleared flags (checked on the
  variant's formulas: `erasable_ghost_flags`), so a state and its cleared copy enable the same
  actions, and each action leads to states that are equal once cleared. The cleared states are
  the classes of a bisimulation: every path of the full graph is a path of classes, and back.
* **The same verdicts, and the same counterexamples.** An `always` property reads no cleared
  flag (each declares what it reads, `Property.reads`, and its formula is checked too), so it
  has one value on a whole class; breadth-first, a class is found
  at the least depth of its members, from the first of them, so the first violation, and the
  shortest path to it, are those of the full search. Termination reads no flag either, and the
  protocol steps between classes are those between their members: the same verdict, the same
  bound. (Where termination fails, its run is the first stuck state or protocol cycle a
  depth-first walk meets, not a shortest one, so on the smaller graph it may be another run,
  replayed like every other.)
* **The same witnesses.** A cleared flag starts false and only a step sets it; a witness that
  reads only such flags, true or false (an `Or` of flags), becomes true on a path exactly where
  a step sets one of its flags. The search asks it on every step that changes the ghost record,
  before the flags are cleared, whether the state stepped to is new or not. A witness that reads
  a flag together with anything else keeps that flag (it is not cleared).

What is not the same is the count: `states` is the number of classes (with `reduce=False`, of
states). On the default scenario (`wide`), the reference has 257,024 states and 180,154 classes.

Anything the analysis cannot see through turns the reduction off: a variant's Python guard or
effect (only formulas can be read), state fields of its own, a property with no declared reads,
a witness with no formula.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvhandoff.spec.effects import EffectFormula, terms_of
from kvhandoff.spec.logic import App, GuardFormula, Op, Term, symbols_of
from kvhandoff.spec.machine import RULE_EFFECTS, RULE_GUARDS, rule_effect, rule_guard
from kvhandoff.spec.properties import ALWAYS, SOMETIMES, Witness
from kvhandoff.spec.state import Ghost, State, evolved
from kvhandoff.spec.variants import FormulaEffect, FormulaGuard, Variant

GHOST_FLAGS: tuple[str, ...] = Ghost._fields
"""The ghost flags, by the names the vocabulary and the `Ghost` record share."""


def _rule_formulas(variant: Variant) -> list[Term] | None:
    """Every term the variant's guards and effects read (None: some guard or effect is Python
    code, which cannot be read)."""
    if variant.extra_actions is not None or variant.state_fields:
        return None
    design = variant.design
    guards: list[GuardFormula] = [
        rule_guard(design, n) for n in RULE_GUARDS if n not in variant.guard_overrides
    ]
    for hook in variant.guard_overrides.values():
        if isinstance(hook, FormulaGuard):
            guards.append(hook.formula)
        elif isinstance(hook, GuardFormula):
            guards.append(hook)
        else:
            return None
    effects: list[EffectFormula] = [
        rule_effect(design, n) for n in RULE_EFFECTS if n not in variant.step_overrides
    ]
    for step in variant.step_overrides.values():
        if not isinstance(step, FormulaEffect):
            return None
        effects.append(step.formula)
    terms = [g.formula for g in guards]
    for e in effects:
        for u in e.updates:
            terms.extend(terms_of(u))
    return terms


def _pure_flags(t: Term) -> set[str] | None:
    """The flags of a witness that is a flag or an `Or` of flags (None: it is something else)."""
    if isinstance(t, App) and t.symbol.name in GHOST_FLAGS and not t.args:
        return {t.symbol.name}
    if isinstance(t, Op) and t.op == "or":
        out: set[str] = set()
        for a in t.args:
            got = _pure_flags(a)
            if got is None:
                return None
            out |= got
        return out
    return None


def erasable_ghost_flags(variant: Variant, invariants: Iterable[Term] = ()) -> tuple[str, ...]:
    """The ghost flags the explorer may clear for `variant` (see the module docstring): read by
    no guard, no effect, no `always` property, none of `invariants` (the formulas the search
    evaluates besides), and, by witnesses, only by witnesses that are flags or `Or`s of flags.
    Empty when some part of the variant cannot be read."""
    terms = _rule_formulas(variant)
    if terms is None:
        return ()
    kept: set[str] = set()
    for t in terms:
        kept |= symbols_of(t)
    for prop in ALWAYS:
        if not prop.reads:
            return ()
        for part in prop.reads:
            name, _, field = part.partition(".")
            if name == "ghost":
                if not field:
                    return ()
                kept.add(field)
        if prop.formula is not None:
            kept |= symbols_of(prop.formula)
    for inv in invariants:
        kept |= symbols_of(inv)
    for w in SOMETIMES:
        if w.formula is None:
            return ()
        flags = _pure_flags(w.formula)
        if flags is None:
            kept |= symbols_of(w.formula)
    return tuple(f for f in GHOST_FLAGS if f not in kept)


class Eraser:
    """Clears `flags` of states' ghost records, one cleared record per distinct record."""

    def __init__(self, flags: tuple[str, ...]) -> None:
        self.flags = flags
        self._blank = {f: False for f in flags}
        self._cleared: dict[Ghost, Ghost] = {}

    def ghost(self, g: Ghost) -> Ghost:
        got = self._cleared.get(g)
        if got is None:
            cleared = evolved(g, self._blank)
            got = self._cleared.setdefault(cleared, cleared)  # one object per cleared record
            self._cleared[g] = got
        return got

    def state(self, s: State) -> State:
        g = self.ghost(s.ghost)
        return s if g is s.ghost else evolved(s, {"ghost": g})


def flag_witnesses(flags: tuple[str, ...]) -> tuple[Witness, ...]:
    """The witnesses that read a cleared flag (each reads only flags: `erasable_ghost_flags`)."""
    out = []
    for w in SOMETIMES:
        assert w.formula is not None
        if symbols_of(w.formula) & set(flags):
            out.append(w)
    return tuple(out)


__all__: list[str] = [
    "GHOST_FLAGS",
    "Eraser",
    "erasable_ghost_flags",
    "flag_witnesses",
]
