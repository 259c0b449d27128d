"""Adversarial peers: the suite plays a faulty or malicious prefill against the target's decode.

The lockstep run drives an honest prefill. An engine's integrity checks (the capability token,
the room and generation on every message, the per-page digest, the completion's page count and
digest, the release fence) are exercised only when something sends decode what an honest prefill
never would. So after every lockstep step the session asks the target to *probe* its decode with
forged messages (`Target.probe`), and compares each reaction with what the spec says it must be.

A probe must leave the run as it was: the in-process target answers it on a copy of its decode
core (`copy.deepcopy`), so the lockstep run, its events and its verdict are the same with or
without probes. A target that cannot do that returns None and is not probed.

The expected reaction comes from the spec wherever the spec can say it: the forged message (a
completion, a page write, an abort ack) is put into the network of the spec state that explains
the target so far, and the spec's own receive step is taken on a copy of that state:

| attack | forged | spec's reaction |
|---|---|---|
| `completion_undercount` | the current grant's completion claiming one page fewer (honest digest of every page) | failed validation |
| `completion_overcount` | ... claiming one page more | failed validation |
| `completion_bad_digest` | right count, a digest over other data | failed validation |
| `completion_early` | the honest completion, sent now (before every write landed, or after) | validated only if every page holds this generation's data |
| `completion_wrong_generation` | right room, a generation decode never granted | ignored: no request changes |
| `completion_wrong_room` | the current generation, another room | ignored |
| `write_wrong_room` | a page of the grant, another room | refused: no page changes |
| `write_wrong_generation` | a page of the grant, a generation never granted | refused |
| `write_page_not_granted` | the grant's identity, a page outside the grant (another request's, if any) | refused |
| `write_replay_released` | a write of an earlier, released generation of the request, replayed (a late or duplicated write) | refused (the spec's ownership check) |
| `abort_ack_replay_released` | the abort ack of a released generation, again | no page changes owner |

Two attacks forge what the spec abstracts away: `completion_forged_token` / `write_forged_token`
(a capability token decode never issued) and `write_corrupt_data` (page bytes that do not hash
to the digest the write claims). The spec identifies a grant by its room and generation and a
page's data by its tag; the token and the per-page digest are how an implementation knows those,
so a message with a forged token is, for the spec, one of no generation decode granted (ignored,
refused), and a page whose bytes are not what its sender hashed carries no tag of this
generation (refused: decode's per-page check, docs/event-log.md).

For every probe that the spec says changes nothing, decode's bookkeeping (free pages, owners,
requests, their states and accepted writes) must also be unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvhandoff.spec.actions import (
    DecodeReceiveAbortAck,
    DecodeReceiveCompletion,
    DecodeReceiveWrite,
)
from kvhandoff.spec.config import Config
from kvhandoff.spec.machine import step
from kvhandoff.spec.state import Message, State, Tag, Write
from kvhandoff.spec.variants import Variant

COMPLETION_ATTACKS = (
    "completion_undercount",
    "completion_overcount",
    "completion_bad_digest",
    "completion_early",
    "completion_wrong_generation",
    "completion_wrong_room",
    "completion_forged_token",
)
WRITE_ATTACKS = (
    "write_wrong_room",
    "write_wrong_generation",
    "write_page_not_granted",
    "write_forged_token",
    "write_corrupt_data",
)
REPLAY_ATTACKS = ("write_replay_released", "abort_ack_replay_released")
ATTACKS = COMPLETION_ATTACKS + WRITE_ATTACKS + REPLAY_ATTACKS

# A generation no decode ever grants (decode's generations are small in the spec, and the
# implementation's start at its boot counter times 2**32).
_NEVER_GRANTED = 1 << 20
_OTHER_ROOM_OFFSET = 1000


@dataclass(frozen=True)
class Attack:
    """One forged message against request `request` (a scenario index)."""

    kind: str
    request: int


@dataclass(frozen=True)
class ProbeResult:
    """How the target's decode reacted to a forged message.

    outcome: for a write `accepted` | `refused`; for a completion `validated` | `failed` |
    `ignored` (refused without touching the request); for an abort ack `ignored`.
    changed: decode's bookkeeping (pages, owners, requests) differs after the probe.
    """

    outcome: str
    changed: bool
    detail: str = ""


@dataclass(frozen=True)
class Expected:
    outcomes: frozenset[str]
    unchanged: bool
    prop: str
    why: str


def attacks_for(state: State) -> list[Attack]:
    """The attacks that make sense in `state`: completions and writes against every request
    decode holds a grant for; replays against requests whose generation decode gave up on."""
    out: list[Attack] = []
    for r, req in enumerate(state.requests):
        if req.d == "reserved":
            out += [Attack(k, r) for k in COMPLETION_ATTACKS + WRITE_ATTACKS]
        elif req.d == "released" and req.d_gen:
            # Not while `failed`: the spec lets a late write land in the pages a failed request
            # still holds (nothing reads them; release scrubs them), so there either reaction
            # is right and a probe would judge nothing.
            out += [Attack(k, r) for k in REPLAY_ATTACKS]
    return out


def expected(variant: Variant, config: Config, state: State, attack: Attack) -> Expected | None:
    """The reaction the spec requires of decode, or None when the spec cannot say (the probe is
    then skipped)."""
    r = attack.request
    req = state.requests[r]
    room = config.requests[r].room
    kind = attack.kind
    if kind in COMPLETION_ATTACKS:
        if req.d != "reserved":
            return None
        after = after_completion(variant, config, state, attack)
        phase = after.requests[r].d
        prop = "accepted_completion_implies_full_coverage"
        if phase == "validated":
            return Expected(frozenset({"validated"}), False, prop, "the spec validates it")
        if phase == "failed":
            return Expected(frozenset({"failed"}), False, prop, "the spec fails its validation")
        if after.requests == state.requests and after.pages == state.pages:
            return Expected(frozenset({"ignored"}), True, prop, "the spec ignores it")
        return None
    if kind in WRITE_ATTACKS:
        if req.d != "reserved" or not req.d_pages:
            return None
        page, gen, rm = req.d_pages[0], req.d_gen, room
        prop = "decode_reads_only_validated_pages"
        if kind in ("write_forged_token", "write_corrupt_data"):
            return Expected(frozenset({"refused"}), True, prop, _CONTRACT[kind])
        if kind == "write_wrong_room":
            rm = room + _OTHER_ROOM_OFFSET
        elif kind == "write_wrong_generation":
            gen = _NEVER_GRANTED
        elif kind == "write_page_not_granted":
            # Another request's page if there is one (the sharper test), else a free one.
            page_or_none = _not_granted_page(state, config, r)
            if page_or_none is None:
                return None
            page = page_or_none
        return _write_expectation(
            variant, config, state, Write(rm, gen, page, _tag(config, r, req.d_gen)), prop
        )
    if kind == "write_replay_released":
        if req.d != "released" or not req.d_gen:
            return None
        # The page the replayed write targets is the target's own (a page of that generation's
        # grant): the spec must refuse it on every page it could be, or the probe is skipped.
        prop = "no_late_write_lands_in_reallocated_page"
        results = {
            _write_expectation(
                variant, config, state, Write(room, req.d_gen, p, _tag(config, r, req.d_gen)), prop
            )
            for p in (req.d_pages or range(config.decode_pages))
        }
        return results.pop() if len(results) == 1 else None
    if kind == "abort_ack_replay_released":
        if req.d != "released" or not req.d_gen:
            return None
        msg = Message("abort_ack", room, req.d_gen, r, dinst=config.requests[r].decode_instance)
        after = _take(variant, config, state, msg, DecodeReceiveAbortAck(msg))
        if after.pages != state.pages:
            return None
        return Expected(
            frozenset({"ignored"}), True, "page_has_single_owner", "the spec changes no page"
        )
    raise ValueError(f"unknown attack {kind!r}; attacks: {', '.join(ATTACKS)}")


def forged_completion(config: Config, state: State, attack: Attack) -> Message:
    """The spec's message for a completion attack against a request decode holds a grant for."""
    r, kind = attack.request, attack.kind
    req = state.requests[r]
    room = config.requests[r].room
    pages = req.d_pages
    honest = tuple((p, r, req.d_gen) for p in pages)
    count, digest, gen, rm = len(pages), honest, req.d_gen, room
    if kind == "completion_undercount":
        count -= 1
    elif kind == "completion_overcount":
        count += 1
    elif kind == "completion_bad_digest":
        digest = tuple((p, -2, -2) for p in pages)
    elif kind in ("completion_wrong_generation", "completion_forged_token"):
        gen = _NEVER_GRANTED
    elif kind == "completion_wrong_room":
        rm = room + _OTHER_ROOM_OFFSET
    # Addressed to the decode instance that holds r, as the target's forged message is.
    dinst = config.requests[r].decode_instance
    return Message("completion", rm, gen, r, count=count, digest=digest, dinst=dinst)


def after_completion(variant: Variant, config: Config, state: State, attack: Attack) -> State:
    """The spec state once decode has received the forged completion of `attack` (a probe that
    changes the run, e.g. an under-count that fails the handoff, continues from here)."""
    msg = forged_completion(config, state, attack)
    return _take(variant, config, state, msg, DecodeReceiveCompletion(msg))


_CONTRACT = {
    "write_forged_token": "a write with a token decode never issued belongs to no granted "
    "generation: refused",
    "write_corrupt_data": "page bytes that do not hash to the claimed digest carry no tag of "
    "this generation: refused",
}


def _not_granted_page(state: State, config: Config, r: int) -> int | None:
    # A page of r's own decode instance: the forged write is sent to the decode that holds r
    # (a page number of another instance's pool names a page of that instance, not this one).
    req = state.requests[r]
    own = config.requests[r].decode_instance
    others = [
        p
        for p in range(config.decode_pages)
        if p not in req.d_pages and config.page_instance(p) == own
    ]
    owned = [p for p in others if state.pages[p].owner is not None]
    choice = owned or others
    return choice[0] if choice else None


def _tag(config: Config, r: int, generation: int) -> Tag:
    return Tag(r, generation, config.requests[r].tenant)


def _write_expectation(
    variant: Variant, config: Config, state: State, write: Write, prop: str
) -> Expected:
    after = _take(variant, config, state, write, DecodeReceiveWrite(write))
    if after.pages == state.pages:
        return Expected(frozenset({"refused"}), True, prop, "the spec refuses it")
    return Expected(frozenset({"accepted"}), False, prop, "the spec lets it land")


def _take(
    variant: Variant,
    config: Config,
    state: State,
    item: Message | Write,
    action: DecodeReceiveCompletion | DecodeReceiveWrite | DecodeReceiveAbortAck,
) -> State:
    """The spec's receive step for a forged message or write, put in flight first."""
    from kvhandoff.spec.state import evolve

    if isinstance(item, Write):
        ready = evolve(state, writes=tuple(sorted((*state.writes, item))))
    else:
        ready = evolve(state, network=tuple(sorted((*state.network, item))))
    return step(variant, config, ready, action)


def judge(attack: Attack, want: Expected, got: ProbeResult) -> str | None:
    """None when the target reacted as the spec requires, else what went wrong."""
    if got.outcome not in want.outcomes:
        return (
            f"forged {attack.kind} against request {attack.request}: decode's reaction was "
            f"{got.outcome!r}, the spec requires {' or '.join(sorted(want.outcomes))} "
            f"({want.why}){': ' + got.detail if got.detail else ''}"
        )
    if want.unchanged and got.changed:
        return (
            f"forged {attack.kind} against request {attack.request}: decode {got.outcome} it "
            f"but its pages or requests changed ({got.detail}); the spec changes nothing"
        )
    return None


__all__ = [
    "ATTACKS",
    "COMPLETION_ATTACKS",
    "REPLAY_ATTACKS",
    "WRITE_ATTACKS",
    "Attack",
    "Expected",
    "ProbeResult",
    "after_completion",
    "attacks_for",
    "expected",
    "forged_completion",
    "judge",
]
