"""Every spec action has one registry row, and everything derived from the registry agrees with it.

The registry (`conformance.registry`) is where a spec action meets the implementation: how the
lockstep runner performs it on a target, which log events it explains, and why where it has no
counterpart. These tests are the completeness check: adding an action to `spec/actions.py`
without its row fails here, and so does a row whose event no matcher explains.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from kvhandoff.conformance.lockstep import drive
from kvhandoff.conformance.mapping import MAPPING, UNLOGGED_SPEC_STEPS
from kvhandoff.conformance.registry import BY_ACTION, REGISTRY, deliver_kinds, missing
from kvhandoff.conformance.target import STEP_KINDS
from kvhandoff.conformance.validate import MATCHED_KINDS
from kvhandoff.spec.actions import ACTIONS_BY_NAME, ALL_ACTIONS, snake_case
from kvhandoff.spec.state import Message, Tag, Write


def test_every_spec_action_has_exactly_one_row() -> None:
    assert missing() == []
    names = [c.action for c in REGISTRY]
    assert len(names) == len(set(names))
    assert sorted(set(names) - set(ACTIONS_BY_NAME)) == [], "rows for actions the spec lacks"


def test_every_event_a_row_names_has_a_matcher() -> None:
    for c in REGISTRY:
        for event in c.events:
            assert event in MATCHED_KINDS, f"{c.action}: no matcher for event {event!r}"


def _spec_names(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z_]+", text) if w in ACTIONS_BY_NAME}


def test_the_mapping_table_and_the_registry_name_the_same_pairs() -> None:
    # A row of the event table says which spec actions explain an event; the registry says which
    # events an action explains. Each side must list the other's pairs.
    table = {(name, row.event) for row in MAPPING for name in _spec_names(row.spec)}
    registry = {(c.action, event) for c in REGISTRY for event in c.events}
    assert sorted(table - registry) == [], "in the event table, missing from the registry"
    assert sorted(registry - table) == [], "in the registry, missing from the event table"


def test_a_step_with_no_event_says_why() -> None:
    for c in REGISTRY:
        if not c.events or c.operation == "none":
            assert c.silent, f"{c.action}: no log event and no reason"
        if c.operation == "none":
            assert c.events == (), f"{c.action}: no counterpart, yet it names events"
    assert {name for name, _ in UNLOGGED_SPEC_STEPS} >= {c.action for c in REGISTRY if not c.events}


def test_the_deliver_step_kinds_are_the_registry_s() -> None:
    assert deliver_kinds() == STEP_KINDS
    assert len(STEP_KINDS) == len(set(STEP_KINDS))


class _Recorder:
    """A target that records which operation it was asked for."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any) -> bool:
            self.calls.append((name, args))
            return True

        return record


def _sample(cls: type) -> Any:
    """An instance of an action class with plausible arguments (request 1, page 2)."""
    tag = Tag(1, 3, "a")
    samples: dict[str, Any] = {
        "request": 1,
        "rank": 0,
        "room": 7,
        "generation": 3,
        "dinst": 0,
        "pinst": 0,
        "message": Message("grant", 7, 3, 1, pages=(2,)),
        "write": Write(7, 3, 2, tag),
    }
    return cls(**{f.name: samples[f.name] for f in dataclasses.fields(cls)})


@pytest.mark.parametrize("cls", ALL_ACTIONS, ids=lambda c: snake_case(c.__name__))
def test_driving_an_action_asks_the_target_for_its_registered_operation(cls: type) -> None:
    action = _sample(cls)
    row = BY_ACTION[snake_case(cls.__name__)]
    target: Any = _Recorder()
    performed = drive(target, action)
    if row.operation.startswith("deliver:"):
        kind = row.operation.removeprefix("deliver:")
        assert target.calls and target.calls[0][0] == "deliver"
        assert target.calls[0][1][0] == kind
        assert performed
    elif row.operation.startswith("with:"):
        assert target.calls == [] and performed
        assert row.operation.removeprefix("with:") in BY_ACTION
    elif row.operation == "none":
        assert target.calls == [] and not performed
    else:
        assert [name for name, _ in target.calls] == [row.operation]


def test_the_z3_fixed_encoding_knows_every_action() -> None:
    from kvhandoff.model_checker.z3_encoding import _CLASSES

    assert sorted(set(ACTIONS_BY_NAME) - set(_CLASSES)) == []
