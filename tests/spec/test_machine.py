from dataclasses import FrozenInstanceError

import pytest

from kvhandoff.spec import (
    FAULT_ACTIONS,
    REFERENCE,
    Config,
    ConfigError,
    RequestSpec,
    default_config,
    enabled,
    get_variant,
    init,
    parse_set,
    step,
)
from kvhandoff.spec.actions import RouterSubmitRequest, action_from_json, action_to_json, is_fault
from kvhandoff.spec.machine import ActionNotEnabled, checked_step
from kvhandoff.spec.state import all_done
from kvhandoff.spec.trace import TraceError, dump_trace, load_trace, replay


def walk(variant_name: str, choose: int, steps: int) -> list[object]:
    """A deterministic walk taking the `choose`-th enabled action (modulo) at each step."""
    variant = get_variant(variant_name)
    config = default_config()
    state = init(config)
    taken = []
    for _ in range(steps):
        actions = enabled(variant, config, state)
        if not actions:
            break
        action = actions[choose % len(actions)]
        taken.append(action)
        state = step(variant, config, state, action)
    return taken


def test_the_initial_state_has_nothing_submitted_and_every_page_free() -> None:
    config = default_config()
    s = init(config)
    assert all(not r.submitted for r in s.requests)
    assert all(p.owner is None and p.content is None for p in s.pages)
    assert len(s.pages) == config.decode_pages
    assert all_done(config, s)


def test_the_first_protocol_step_is_submitting_the_first_request() -> None:
    config = default_config()
    actions = enabled(REFERENCE, config, init(config))
    assert [a for a in actions if not is_fault(a)] == [RouterSubmitRequest(0)]


def test_enabled_lists_protocol_steps_before_faults() -> None:
    for choose in range(5):
        variant = REFERENCE
        config = default_config()
        state = init(config)
        for action in walk("reference", choose, 15):
            actions = enabled(variant, config, state)
            kinds = [is_fault(a) for a in actions]
            assert kinds == sorted(kinds), "a fault is listed before a protocol step"
            state = step(variant, config, state, action)


def test_fault_actions_are_the_declared_ones() -> None:
    names = {cls.__name__ for cls in FAULT_ACTIONS}
    assert "DecodeRestart" in names and "NetworkDropMessage" in names
    assert "DecodeReservePages" not in names


def test_states_and_actions_are_frozen_and_hashable() -> None:
    config = default_config()
    s = init(config)
    assert hash(s) == hash(init(config))
    with pytest.raises(AttributeError):  # a record: its fields cannot be set
        s.next_generation = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        s.requests[0].p = "granted"  # type: ignore[misc]
    action = enabled(REFERENCE, config, s)[0]
    with pytest.raises(FrozenInstanceError):
        action.request = 2  # type: ignore[misc]


def test_step_is_deterministic() -> None:
    config = default_config()
    a = init(config)
    b = init(config)
    for action in walk("reference", 3, 25):
        a = step(REFERENCE, config, a, action)
        b = step(REFERENCE, config, b, action)
        assert a == b


def test_a_disabled_action_is_refused_by_checked_step() -> None:
    config = default_config()
    from kvhandoff.spec.actions import DecodeGenerate

    with pytest.raises(ActionNotEnabled, match="decode_generate"):
        checked_step(REFERENCE, config, init(config), DecodeGenerate(0))


def test_generations_never_repeat_even_across_a_decode_restart() -> None:
    from kvhandoff.spec.actions import DecodeAdmitRequest, DecodeReservePages, DecodeRestart

    config = default_config()
    s = init(config)
    s = step(REFERENCE, config, s, RouterSubmitRequest(0))
    s = step(REFERENCE, config, s, DecodeAdmitRequest(0))
    s = step(REFERENCE, config, s, DecodeReservePages(0))
    first = s.requests[0].d_gen
    s = step(REFERENCE, config, s, DecodeRestart())
    assert s.next_generation > first
    reset = get_variant("generation_reset_on_restart")
    t = step(
        reset,
        config,
        step(REFERENCE, config, init(config), RouterSubmitRequest(0)),
        DecodeAdmitRequest(0),
    )
    t = step(reset, config, t, DecodeReservePages(0))
    t = step(reset, config, t, DecodeRestart())
    assert t.next_generation == first


def test_actions_round_trip_through_json() -> None:
    for choose in (0, 1, 2, 7):
        for action in walk("incident", choose, 30):
            assert action_from_json(action_to_json(action)) == action


def test_a_trace_round_trips_and_replays() -> None:
    config = default_config()
    actions = walk("reference", 2, 20)
    text = dump_trace(config, actions, kind="scenario", variant="reference")
    trace = load_trace(text)
    assert trace.config == config
    assert list(trace.actions) == actions
    assert len(replay(REFERENCE, config, trace.actions)) == len(actions) + 1


def test_a_trace_with_an_action_out_of_order_fails_to_replay_naming_the_step() -> None:
    config = default_config()
    actions = walk("reference", 0, 6)
    bad = [actions[0], actions[5]]
    with pytest.raises(TraceError, match="step 2"):
        replay(REFERENCE, config, bad)


def test_malformed_traces_are_rejected_with_the_line_number() -> None:
    with pytest.raises(TraceError, match="line 1"):
        load_trace("not json\n")
    good = dump_trace(default_config(), [RouterSubmitRequest(0)])
    with pytest.raises(TraceError, match="line 2"):
        load_trace(good.replace("router_submit_request", "router_teleport"))
    with pytest.raises(TraceError, match="schema version"):
        load_trace(good.replace('"kvhandoff_trace": 1', '"kvhandoff_trace": 9'))


def test_config_errors_name_the_field_and_value() -> None:
    with pytest.raises(ConfigError, match="decode_pages"):
        Config(decode_pages=0)
    with pytest.raises(ConfigError, match="request 0: pages"):
        Config(requests=(RequestSpec("a", 0, 1),))
    with pytest.raises(ConfigError, match="prefill_ranks must be an integer from 1 to 4"):
        Config(prefill_ranks=0)
    with pytest.raises(ConfigError, match="prefill_ranks"):
        parse_set(default_config(), ["prefill_ranks=5"])
    with pytest.raises(ConfigError, match="unknown key"):
        parse_set(default_config(), ["pool=3"])
    with pytest.raises(ConfigError, match="expected an integer"):
        parse_set(default_config(), ["decode_pages=many"])
    with pytest.raises(ConfigError, match="TENANT:PAGES:ROOM"):
        parse_set(default_config(), ["requests=a:1"])


def test_set_overrides_fields() -> None:
    c = parse_set(
        default_config(), ["decode_pages=5", "requests=x:1:7,y:2:8", "submit_in_order=false"]
    )
    assert c.decode_pages == 5
    assert c.requests == (RequestSpec("x", 1, 7), RequestSpec("y", 2, 8))
    assert c.submit_in_order is False
    assert Config.from_json(c.to_json()) == c


def test_the_default_scenario_has_two_tenants_an_oversized_prompt_a_crash_and_a_loss() -> None:
    c = default_config()
    assert len(c.tenants) == 2
    assert len(c.requests) >= 3
    assert any(r.pages > c.prefill_max_prompt for r in c.requests)
    assert any(r.pages <= c.context_window for r in c.requests if r.pages > c.prefill_max_prompt)
    assert c.max_crashes >= 1 and c.max_drops >= 1 and c.max_faults >= 1


@pytest.mark.parametrize("n", [2, 12])  # below and above the few-items shortcut of `_items_hash`
def test_a_stepped_states_kept_hash_is_the_hash_of_an_equal_fresh_state(n: int) -> None:
    # `State` keeps hashes of its parts and hands them on through `evolve`; an equal state
    # built from scratch must hash the same, on every state of a random walk.
    import random
    from dataclasses import fields

    from kvhandoff.spec.state import State

    # Past the explicit model's size limits, as the log validator's scenarios are.
    config = object.__new__(Config)
    for f in fields(Config):
        object.__setattr__(config, f.name, getattr(default_config(), f.name))
    object.__setattr__(
        config, "requests", tuple(RequestSpec(f"t{i % 3}", 1, i + 1) for i in range(n))
    )
    object.__setattr__(config, "decode_pages", n)
    object.__setattr__(config, "max_active", 2)
    rng = random.Random(n)
    state = init(config)
    for _ in range(60):
        options = enabled(REFERENCE, config, state)
        if not options:
            break
        state = step(REFERENCE, config, state, rng.choice(options))
        fresh = State(**{f.name: getattr(state, f.name) for f in fields(State)})
        assert fresh == state and hash(fresh) == hash(state)
