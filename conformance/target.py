"""What an implementation must offer to be tested: the `Target` API.

A target plays one spec scenario (`spec.config.Config`: requests with tenant, length in pages and
room; the pool and limits in pages; `page_size` tokens per page) in one implementation mode. The
conformance suite drives it with the operations below and judges it from what it hands back: its
event log (the format of `docs/event-log.md`, plus harness lines for faults the target injected)
and the answers its clients got.

Operations take the spec's request index `r` (0-based position in `config.requests`). A *message
kind* is one of the spec's: `grant`, `completion`, `failure`, `abort`, `abort_ack`. Fine-grained
operations (`deliver`, `drop`, ...) return False when the target has nothing of that kind pending
(or cannot control that step); the runner then treats the step as not taken.

Canaries: every prompt a target sends is built by `canary_prompt(tenant, r, tokens)`: tokens
unique to the tenant, so that an answer carrying another tenant's tokens is an isolation failure
that names both requests (`TargetAnswer.foreign`).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kvhandoff.conformance.registry import deliver_kinds
from kvhandoff.spec.config import Config

Event = dict[str, Any]


class TargetError(Exception):
    """The target itself failed, as opposed to diverging from the spec: a harness service that
    cannot be reached, refuses a call or breaks its contract. A campaign or replay stops at the
    first one and re-raises it (no verdict: the CLI exits 3, inconclusive); it is never shrunk or
    reported as a divergence."""


# Deliverable steps (`Target.deliver`): which spec action each performs is its row in
# `conformance.registry` (operation `deliver:<kind>`).
STEP_KINDS: tuple[str, ...] = deliver_kinds()


@dataclass
class TargetAnswer:
    """What the client of request r got."""

    ok: bool
    code: str = ""
    message: str = ""
    read: list[str | None] = field(default_factory=list)
    """Tenant of the data in each page the answer was generated from (None: zeroed)."""
    foreign: list[tuple[str, str]] = field(default_factory=list)
    """(request id, tenant) of other tenants' canaries found in the answer."""


class UnsupportedScenario(ValueError):
    """The scenario needs something the implementation does not have (the message says what)."""


def require_one_prefill_rank(
    config: Config, retries: bool = False, instances: bool = False
) -> None:
    """Refuse a scenario with several prefill ranks: our implementation has one prefill server,
    which writes whole pages and sends one completion, so it cannot play one (and a lockstep run
    against the several-rank spec would diverge at the first write, not find a bug). Refuse
    several instances too, unless the target plays them (`instances`, `Target.instances`), and
    then still refuse what it cannot play (see `require_playable_instances`)."""
    if config.prefill_ranks != 1:
        raise UnsupportedScenario(
            f"prefill_ranks={config.prefill_ranks}: the implementation has one prefill server "
            "(one rank), so conformance runs only scenarios with prefill_ranks=1; check "
            "several-rank designs with `kvhandoff check --set prefill_ranks=N`"
        )
    if config.prefill_instances != 1 or config.decode_instances != 1:
        if not instances:
            raise UnsupportedScenario(
                f"prefill_instances={config.prefill_instances}, decode_instances="
                f"{config.decode_instances}: this target runs one prefill and one decode server, "
                "so it plays only scenarios with one instance of each; the in-process and gRPC "
                "targets play several (`kvhandoff conform --instances`), and `kvhandoff check "
                "--scenario instances` checks several-instance designs"
            )
        require_playable_instances(config)
    if config.rooms != "fixed":
        raise UnsupportedScenario(
            f"rooms={config.rooms}: a run plays each request with one room; set rooms=fixed and "
            "give two requests one room in --set requests= to play a collision, or let "
            "`kvhandoff conform --rooms-any` draw one choice of rooms per program "
            "(`kvhandoff check --set rooms=any` checks every choice)"
        )
    # Checked here too, so that every caller refuses it unless its target plays a client's
    # retry under the same request id (`Target.retries`; the registry's row for
    # `router_retry_request`).
    if config.max_retries and not retries:
        raise UnsupportedScenario(
            f"max_retries={config.max_retries}: this target cannot play a client's retry under "
            "the same request id (`Target.retries` is off: only the in-process target plays "
            "one so far; the gRPC target's client would need the router's retry call ordered "
            "after both workers' results, which its coarse run cannot promise); replay it with "
            "--target inproc, or check retries with `kvhandoff check --set max_retries=N`"
        )


def require_playable_instances(config: Config) -> None:
    """What a target that plays several instances (the in-process one) still cannot play: a
    placement the router chooses (`placement=any`). A run places each request once, so a
    program plays one fixed placement (the campaign draws one per program, `placements`)."""
    several = config.prefill_instances > 1 or config.decode_instances > 1
    if several and config.placement != "fixed":
        raise UnsupportedScenario(
            f"placement={config.placement} with prefill_instances={config.prefill_instances}, "
            f"decode_instances={config.decode_instances}: a run plays one placement; set "
            "placement=fixed and place each request in --set requests= (TENANT:PAGES:ROOM:P/D), "
            "or let `kvhandoff conform --instances` draw one per program"
        )


class Target(abc.ABC):
    """An implementation under test. Subclass it (or speak the harness protocol, docs/conformance.md)."""

    name: str = "target"
    shortfall: Mapping[int, int] = MappingProxyType({})
    """Tokens short of whole pages, by request: request r's prompt is `pages * page_size -
    shortfall[r]` tokens (0 <= shortfall < page_size, so its page count, which is all the spec
    speaks of, is unchanged). The campaign sets it per program to play prompts that end inside
    a page; a target that builds prompts should honour it (`prompt_tokens`)."""
    fine_grained: bool = True
    """True when `deliver`/`drop`/`duplicate` control single messages (lockstep possible); a
    coarse target supports only submit, cancel, crashes and `settle`, and is judged on its log."""
    instances: bool = False
    """True when the target plays several prefill and decode instances (one core of each per
    instance, each request on the instances its placement names; `require_playable_instances`
    says what it still refuses). Page numbers in its log and `page_contents` are the spec's,
    global over the instances' pools; `restart_prefill`, `restart_decode` and
    `suspect_prefill_dead` then take the instances (`pinst=`, `dinst=`, left out for 0), and
    `deliver("heartbeat", dinst, pinst)` is decode instance dinst's probe of prefill pinst."""
    retries: bool = False
    """True when the target plays the spec's `router_retry_request` (`retry`): the client
    resubmits a failed request under the same id, and the implementation numbers the attempt.
    `deliver` then takes the spec message's `attempt` too, to pick the message of that attempt
    where a first attempt's late message and the retry's are both pending."""

    @abc.abstractmethod
    def start(self, config: Config, mode: str) -> None:
        """Start from a clean state: empty pools, no requests, fresh logs."""

    @abc.abstractmethod
    def submit(self, r: int) -> None:
        """The client sends request r (tenant, canary prompt of pages*page_size tokens, room)."""

    @abc.abstractmethod
    def cancel(self, r: int) -> bool:
        """The client cancels request r."""

    def deliver(self, kind: str, r: int, page: int | None = None) -> bool:
        """Deliver one pending step of `kind` (see `STEP_KINDS`) for request r. A target with
        `retries` also takes `attempt=` (the spec message's attempt, None when the step names
        no message). `heartbeat` names no request: r is the decode instance whose health probe
        answers and `page` the prefill instance it probes (None: 0)."""
        return False

    def retry(self, r: int) -> bool:
        """The client retries request r under the same id after it got an error (the spec's
        `router_retry_request`); only a target with `retries` plays it."""
        return False

    def drop(self, kind: str, r: int) -> bool:
        """Lose a pending control message; the sender will retransmit it (`retransmit`)."""
        return False

    def retransmit(self, kind: str, r: int) -> bool:
        return False

    def duplicate(self, kind: str, r: int) -> bool:
        return False

    def fire_timeout(self, r: int) -> bool:
        """Decode's waiting timeout for request r fires now."""
        return False

    def prefill_abort(self, r: int) -> bool:
        """Prefill fails request r on its own: its write stream breaks, or, before its grant,
        its scheduler gives up on it. Asked with writes of r still in flight too (the spec's
        `prefill_write_error`: a write failed on prefill's side): those stay in flight and may
        still land; False where the target cannot leave them so."""
        return False

    def suspect_prefill_dead(self) -> bool:
        """A network partition between decode and a prefill that stays up: decode's health
        probe of prefill misses until decode takes prefill for dead, then the partition heals
        (prefill answers the next probe, with the same boot epoch). False: the target cannot cut
        the probe off, or cannot do it now (the spec step is not taken)."""
        return False

    @abc.abstractmethod
    def restart_prefill(self) -> None: ...

    @abc.abstractmethod
    def restart_decode(self) -> None: ...

    @abc.abstractmethod
    def settle(self) -> None:
        """Let everything pending happen (no new faults) until the target is quiescent."""

    @abc.abstractmethod
    def take_events(self) -> list[Event]:
        """Event-log lines produced since the last call, in a causal order."""

    @abc.abstractmethod
    def answers(self) -> dict[int, TargetAnswer]:
        """Answers the clients got so far, by request index."""

    @abc.abstractmethod
    def quiescent(self) -> bool:
        """No request in progress anywhere and every decode page free."""

    def request_id(self, r: int) -> str:
        return f"r{r}"

    def prompt_tokens(self, config: Config, r: int) -> int:
        """The length in tokens of request r's prompt (see `shortfall`)."""
        return config.requests[r].pages * config.page_size - self.shortfall.get(r, 0)

    def wait_answered(self, r: int) -> None:
        """Block until request r's client has its answer (coarse targets; replay uses it to keep
        a trace's order: a request the trace answered before the next submit is answered)."""
        return None

    def describe(self) -> str:
        """What is still in progress (for reports)."""
        return ""

    def probe(self, attack: Any) -> Any:
        """Play a faulty or malicious prefill against decode (`conformance.adversary`): send
        decode the forged message `attack` describes and say how it reacted (a
        `conformance.adversary.ProbeResult`), without changing the run (the in-process target
        answers on a copy of its decode). None: this target cannot probe, or has nothing to
        forge it from now (no grant, no earlier generation of the request)."""
        return None

    def page_contents(self) -> dict[int, str | None] | None:
        """Whose data each decode page holds now: page -> the request id of the write that last
        landed there, None for a zeroed page. None: this target cannot tell (not checked)."""
        return None

    def not_covered(self) -> dict[str, str]:
        """Operations this target said it cannot perform at all (operation -> why), e.g. a
        remote engine that answers UNIMPLEMENTED for `drop`. The runner skips those steps (the
        spec moves only on events) and reports them, so a verdict never hides a gap."""
        return {}

    def close(self) -> None:
        """Stop whatever `start` started."""
        return None

    def shutdown(self) -> None:
        """Release everything the target holds (after the last trace); default: `close`."""
        self.close()


def canary_prompt(tenant: str, r: int, tokens: int) -> list[int]:
    """A prompt of `tokens` byte tokens that only tenant `tenant` ever sends: its canary."""
    base = _tenant_byte(tenant)
    return [base] * tokens


def _tenant_byte(tenant: str) -> int:
    # Printable, non-zero and distinct per tenant name in a scenario (A..Z, then a..z, ...).
    h = sum((i + 1) * ord(c) for i, c in enumerate(tenant))
    return 65 + h % 58


def canary_owner(token: int, tenants: list[str]) -> str | None:
    for t in tenants:
        if _tenant_byte(t) == token:
            return t
    return None


__all__ = [
    "STEP_KINDS",
    "Event",
    "Target",
    "TargetAnswer",
    "TargetError",
    "UnsupportedScenario",
    "canary_owner",
    "canary_prompt",
    "require_one_prefill_rank",
    "require_playable_instances",
]
