"""The explorer's reductions (`model_checker/reduction.py`): states that differ only in ghost flags
that only witnesses read, or in prefill's fields of a request prefill has finished with, are
stored once. They must change nothing the explorer reports but the number of states: every
property's verdict, every safety counterexample (action by action), every witness, the
termination bound. Checked here against the full search on every variant of the differential
test (catalogue, examples, overrides, one-option design flips), with the cleared fields poisoned
(below), and each of the analyses' refusals on its own."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest

from kvhandoff.model_checker.explore import explore
from kvhandoff.model_checker.reduction import (
    PREFILL_FIELDS,
    Eraser,
    _pure_flags,
    cleared_fields_of,
    erasable_ghost_flags,
    erasable_prefill_fields,
)
from kvhandoff.model_checker.result import CheckResult
from kvhandoff.spec.config import Config, parse_set, scenario_config
from kvhandoff.spec.effects import answer_ok, assign, effect
from kvhandoff.spec.logic import And, Or
from kvhandoff.spec.properties import TERMINATION
from kvhandoff.spec.state import ReqState, State
from kvhandoff.spec.variants import REFERENCE, Variant, get_variant
from kvhandoff.spec.vocabulary import (
    d,
    drain_acked,
    not_as_is,
    p,
    p_cancel,
    p_gen,
    p_len,
    page_reuse,
    refused_write,
)
from tests.explored import RETRY_TINY
from tests.model_checker.differential import (
    OVERRIDES,
    design_flips,
    every_variant,
)
from tests.model_checker.small import SMALL

SMALL_FAULTY = parse_set(SMALL, ["max_faults=1"])


def _answers(result: CheckResult) -> dict[str, object]:
    """Everything a search reports but its state count (and the depth it searched to, which
    for a property that holds is the depth of the deepest state it stored)."""
    props = {
        r.property: (r.verdict, r.depth if r.verdict == "violated" else None, r.trace)
        for r in result.results
        if r.property != TERMINATION.name
    }
    # Termination's run is the first stuck state or protocol cycle a depth-first walk of the
    # graph meets, not a shortest one: on another graph, another (each is replayed). Its
    # verdict, and the bound where it holds, are the same.
    term = result.result_for(TERMINATION.name)
    props[TERMINATION.name] = (term.verdict, term.depth if term.verdict == "holds" else None, None)
    return {
        "properties": props,
        "witnesses": dict(result.witnesses),
        "response_bound": result.extra.get("response_bound"),
        "complete": result.extra.get("complete"),
    }


def _same_answers(variant: Variant, config: Config) -> tuple[int, int]:
    full = explore(variant, config, reduce=False)
    reduced = explore(variant, config)
    assert _answers(reduced) == _answers(full), variant.name
    assert full.states is not None and reduced.states is not None
    assert reduced.states <= full.states
    assert not full.extra["cleared_flags"]
    return full.states, reduced.states


# The catalogue, examples and overrides here; every one-option design change in `make test-slow`.
ROWS = [
    *(pytest.param(v, id=v.name) for v in every_variant()),
    *(pytest.param(v, id=v.name, marks=pytest.mark.slow) for v in design_flips()),
]


@pytest.mark.parametrize("variant", ROWS)
def test_the_reduced_search_answers_as_the_full_one(variant: Variant) -> None:
    _same_answers(variant, variant.scenario(SMALL_FAULTY))


@pytest.mark.slow
@pytest.mark.parametrize("variant", every_variant(), ids=lambda v: v.name)
def test_the_reduced_search_answers_as_the_full_one_on_each_variants_scenario(
    variant: Variant,
) -> None:
    """Each variant on the scenario it is checked on (`kvhandoff variants`): wide, mostly."""
    _same_answers(variant, variant.scenario(scenario_config(variant.scenario_name or "wide")))


def test_the_reduction_stores_fewer_states_where_a_witness_flag_is_set() -> None:
    full, reduced = _same_answers(REFERENCE, SMALL_FAULTY)
    assert reduced < full


@pytest.mark.slow
def test_the_sequential_scenario_counts() -> None:
    """The reference on `sequential`: 71,075 states, as pinned elsewhere, and fewer classes."""
    full, reduced = _same_answers(REFERENCE, Config())
    assert full == 71_075
    assert reduced < full


def test_python_hooks_turn_the_reduction_off() -> None:
    for variant in OVERRIDES:
        assert erasable_ghost_flags(variant) == ()
        assert not explore(variant, SMALL).extra["cleared_flags"]


def test_a_flag_an_effect_reads_is_kept() -> None:
    reading = REFERENCE.derive(
        "reads_page_reuse",
        "prefill's rejection also marks the request when some page was reused",
        step_overrides={
            "prefill_reject_request": effect(
                lambda r: [
                    assign(p(r), "rejected"),
                    assign(not_as_is(r), True, when=page_reuse()),
                ]
            )
        },
    )
    assert "page_reuse" in erasable_ghost_flags(REFERENCE)
    assert "page_reuse" not in erasable_ghost_flags(reading)
    assert "drain_acked" in erasable_ghost_flags(reading)


def test_a_flag_an_invariant_reads_is_kept() -> None:
    assert "refused_write" not in erasable_ghost_flags(REFERENCE, [refused_write()])


def test_checking_the_invariants_keeps_every_state() -> None:
    """`--invariants` compares formulas with their Python functions on every reachable state."""
    result = explore(REFERENCE, SMALL_FAULTY, invariants=True)
    assert not result.extra["cleared_flags"]
    assert result.states == explore(REFERENCE, SMALL_FAULTY, reduce=False).states


def test_only_a_flag_or_an_or_of_flags_is_a_flag_witness() -> None:
    assert _pure_flags(page_reuse()) == {"page_reuse"}
    assert _pure_flags(Or(refused_write(), drain_acked())) == {"refused_write", "drain_acked"}
    assert _pure_flags(And(page_reuse(), drain_acked())) is None


def test_check_no_reduce(capsys: pytest.CaptureFixture[str]) -> None:
    from kvhandoff.cli.main import main

    small = ["--scenario", "sequential", "--set", "requests=a:1:1,b:2:1", "--set", "decode_pages=2"]
    full_states = explore(REFERENCE, parse_set(Config(), small[3::2]), reduce=False).states
    assert main(["check", "--variant", "reference", *small]) == 0
    reduced = capsys.readouterr().out
    assert "counted once: --no-reduce counts each" in reduced
    assert f"{full_states:,} states" not in reduced
    assert main(["check", "--variant", "reference", *small, "--no-reduce"]) == 0
    full = capsys.readouterr().out
    assert f"{full_states:,} states" in full and "counted once" not in full
    assert main(["check", "--variant", "reference", "--engine", "bmc", "--no-reduce"]) == 2
    assert "--no-reduce applies to --engine explore" in capsys.readouterr().err


def test_the_incident_counterexample_is_the_full_searchs() -> None:
    incident = get_variant("incident")
    config = incident.scenario(Config())
    full = explore(incident, config, reduce=False)
    reduced = explore(incident, config)
    assert reduced.verdict == "violated"
    assert _answers(reduced) == _answers(full)


# --- Prefill's fields of finished requests ------------------------------------------------------
#
# The analysis (`erasable_prefill_fields`) reads the formulas; what runs is their concrete
# reading, compiled, and the properties' Python functions. So the search is also run with every
# cleared field holding a poison value that refuses to be looked at while a guard, an effect, a
# property, a witness or the termination check runs: any read of a cleared field of a finished
# request fails the test, and so does a cleared value that a step copies anywhere but a cleared
# field of a finished request (a message, a write, a request taken back to work).


class PoisonRead(AssertionError):
    pass


class _Poison:
    """A cleared field's value in the poisoned search. Outside the rules it hashes and compares
    by identity (the search's own tables store states); inside them any use fails."""

    armed = 0

    def __repr__(self) -> str:
        return "POISON"

    def __hash__(self) -> int:
        if _Poison.armed:
            raise PoisonRead("a rule hashed a cleared field")
        return 0x5EED

    def __eq__(self, other: object) -> bool:
        if _Poison.armed:
            raise PoisonRead("a rule compared a cleared field")
        return self is other

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)


def _refuse(name: str) -> Any:
    def refused(self: _Poison, *args: Any) -> Any:
        raise PoisonRead(f"{name} of a cleared field")

    return refused


for _name in (
    "__bool__", "__len__", "__iter__", "__contains__", "__getitem__", "__lt__", "__le__",
    "__gt__", "__ge__", "__add__", "__radd__", "__sub__", "__rsub__", "__index__", "__int__",
    "__mul__", "__rmul__", "__and__", "__rand__", "__or__", "__ror__", "__neg__",
):  # fmt: skip
    setattr(_Poison, _name, _refuse(_name))

POISON = _Poison()


def _armed(fn: Any) -> Any:
    def run(*args: Any) -> Any:
        _Poison.armed += 1
        try:
            return fn(*args)
        finally:
            _Poison.armed -= 1

    return run


def _holds_poison(value: Any) -> bool:
    if value is POISON:
        return True
    return isinstance(value, tuple) and any(_holds_poison(v) for v in value)


def _leaks(state: State, fields: tuple[str, ...]) -> bool:
    """Does `state` hold the poison anywhere but a cleared field of a finished request?"""
    for req in state.requests:
        cleared = {ReqState._fields.index(f) for f in cleared_fields_of(req, fields)}
        for i, value in enumerate(req):
            if i not in cleared and _holds_poison(value):
                return True
    return any(_holds_poison(part) for part in state[1:])


class _PoisonEraser(Eraser):
    def __init__(self, flags: tuple[str, ...], fields: tuple[str, ...] = ()) -> None:
        super().__init__(flags, fields)
        self._fresh = {f: POISON for f in self._fresh}
        self._fresh_as_is = {f: POISON for f in self._fresh_as_is}


class _PoisonedRules:
    def __init__(self, inner: Any, fields: tuple[str, ...]) -> None:
        self.inner, self.fields = inner, fields

    def enabled_for(self, config: Config) -> Any:
        return _armed(self.inner.enabled_for(config))

    def steps_for(self, config: Config, search: bool = False) -> Any:
        steps, fields = self.inner.steps_for(config, search), self.fields

        class Checked:
            def __getitem__(self, kind: type) -> Any:
                run = _armed(steps[kind])

                def step(c: Config, s: State, a: Any) -> State:
                    t: State = run(c, s, a)
                    if _leaks(t, fields):
                        raise PoisonRead(f"{a} copied a cleared field: {t}")
                    return t

                return step

        return Checked()


def _poisoned_search(
    monkeypatch: pytest.MonkeyPatch, variant: Variant, config: Config
) -> CheckResult:
    from kvhandoff.model_checker import explore as module

    fields = erasable_prefill_fields(variant, config)
    inner = module.rules
    monkeypatch.setattr(module, "rules", lambda v: _PoisonedRules(inner(v), fields))
    monkeypatch.setattr(module, "Eraser", _PoisonEraser)
    monkeypatch.setattr(module, "all_done", _armed(module.all_done))
    monkeypatch.setattr(
        module,
        "ALWAYS",
        tuple(
            dataclasses.replace(
                p,
                holds=_armed(p.holds),
                each_request=p.each_request and _armed(p.each_request),
                each_page=p.each_page and _armed(p.each_page),
            )
            for p in module.ALWAYS
        ),
    )
    monkeypatch.setattr(
        module,
        "SOMETIMES",
        tuple(dataclasses.replace(w, reached=_armed(w.reached)) for w in module.SOMETIMES),
    )
    result = explore(variant, config)
    monkeypatch.undo()
    return result


# In `make test`, a variant of each outcome of the analysis (everything cleared; the generation
# kept by room-keyed matching; the lease kept on the pull path; decode instances' release and
# fences; no reduction for Python hooks); every variant in `make test-slow`.
POISON_QUICK = {
    "reference",
    "incident",
    "room_keyed_matching",
    "reference_pull",
    "m8_release_on_timeout",
    "release_on_suspected_death",
    "one_sided_fenced",
    "override_reject",
}
POISON_ROWS = [
    pytest.param(v, id=v.name, marks=() if v.name in POISON_QUICK else pytest.mark.slow)
    for v in every_variant()
]


@pytest.mark.parametrize("variant", POISON_ROWS)
def test_nothing_reads_the_cleared_fields_of_a_finished_request(
    monkeypatch: pytest.MonkeyPatch, variant: Variant
) -> None:
    config = variant.scenario(SMALL_FAULTY)
    poisoned = _poisoned_search(monkeypatch, variant, config)
    assert _answers(poisoned) == _answers(explore(variant, config, reduce=False)), variant.name


def test_the_reference_clears_every_prefill_field_and_room_keyed_matching_keeps_the_generation() -> (
    None
):
    """What the analysis finds on the designs docs/spec.md names: everything on the reference;
    under room-keyed matching prefill takes an abort for a completed grant by its generation;
    on the pull path a write in flight reads its request's lease."""
    config = Config()
    assert set(erasable_prefill_fields(REFERENCE, config)) == set(PREFILL_FIELDS)
    room = erasable_prefill_fields(get_variant("room_keyed_matching"), config)
    assert set(PREFILL_FIELDS) - set(room) == {"p_gen"}
    pull = erasable_prefill_fields(get_variant("reference_pull"), config)
    assert set(PREFILL_FIELDS) - set(pull) == {"p_gen", "p_lease_expired"}
    # With several decode instances a message's decode address is read off the grant's pages
    # (and, for the drain ack a finished request owes, off its grant's generation and address).
    two = erasable_prefill_fields(REFERENCE, parse_set(config, ["decode_instances=2"]))
    assert "p_pages" not in two and "p_len" in two


def _answer_effect_reading(term: Any) -> Variant:
    """The reference, with decode's answer also marking the request where `term` holds."""
    return REFERENCE.derive(
        "answer_reads",
        "decode's answer reads a prefill field",
        step_overrides={
            "decode_answer": effect(
                lambda r: [
                    answer_ok(r),
                    assign(d(r), "answered"),
                    assign(not_as_is(r), True, when=term(r)),
                ]
            )
        },
    )


def test_a_prefill_field_read_of_a_finished_request_is_kept() -> None:
    # Decode answers whatever prefill's phase: the read may be of a finished request.
    reading = _answer_effect_reading(lambda r: p_len(r) == 0)
    assert "p_len" not in erasable_prefill_fields(reading, Config())
    # Read only where prefill still works on the request: moot for a finished one.
    moot = _answer_effect_reading(lambda r: And(p(r) == "granted", p_len(r) == 0))
    assert "p_len" in erasable_prefill_fields(moot, Config())
    # `Or(p(r) is finished, ...)`: the second disjunct counts only where the first fails.
    moot_or = _answer_effect_reading(
        lambda r: Or(p(r).is_in("rejected", "completed", "aborted", "lost"), p_len(r) == 0)
    )
    assert "p_len" in erasable_prefill_fields(moot_or, Config())


def test_a_step_that_takes_a_finished_request_back_without_setting_its_fields_keeps_them() -> None:
    """A retry sets every prefill field afresh; a step that takes a request back to `received`
    and sets only some leaves the others readable."""
    partial = REFERENCE.derive(
        "half_retry",
        "prefill takes a cancelled request back, resetting only its grant's generation",
        step_overrides={
            "prefill_receive_cancel": effect(
                lambda r: [
                    assign(p_cancel(r), False),
                    assign(p(r), "received"),
                    assign(p_gen(r), 0),
                ]
            )
        },
    )
    kept = set(PREFILL_FIELDS) - set(erasable_prefill_fields(partial, Config()))
    assert kept == set(PREFILL_FIELDS) - {"p_gen"}


def test_the_poisoned_search_catches_a_field_wrongly_cleared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The harness itself: room-keyed matching reads `p_gen` of completed requests; told to
    clear it anyway, the poisoned search fails."""
    from kvhandoff.model_checker import explore as module

    variant = get_variant("room_keyed_matching")
    monkeypatch.setattr(module, "erasable_prefill_fields", lambda v, c: tuple(PREFILL_FIELDS))
    monkeypatch.setattr(
        sys.modules[__name__], "erasable_prefill_fields", lambda v, c: tuple(PREFILL_FIELDS)
    )
    with pytest.raises(PoisonRead):
        _poisoned_search(monkeypatch, variant, variant.scenario(SMALL_FAULTY))


def test_a_retry_sets_every_cleared_field_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """The retry takes a finished request back to work: poisoned, on the smallest scenario in
    which the router retries (every variant's retry scenario is in `make test-slow`)."""
    variant = get_variant("retry_reuses_request_id")
    config = parse_set(variant.scenario(Config()), [*RETRY_TINY, "max_faults=1"])
    assert set(erasable_prefill_fields(variant, config)) == set(PREFILL_FIELDS)
    poisoned = _poisoned_search(monkeypatch, variant, config)
    assert poisoned.extra["cleared_fields"]
    assert _answers(poisoned) == _answers(explore(variant, config, reduce=False))
