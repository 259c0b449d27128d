"""Lockstep: the spec chooses each step, the target performs it, the spec judges what happened.

One step: take the spec state that explains the target's events so far, pick one of the actions
the spec's own `enabled` offers there (protocol steps first, faults last, so Hypothesis shrinks
towards fault-free programs), perform it on the target (`drive`), and feed the events the target
logged to the validator, which must explain them by enabled spec steps whose states satisfy every
`always` property. After the program the target settles (no new faults) and the final checks run:
every request answered, the answers agree with the spec (ok/error, and the data they were generated
from), no canary of another tenant in any answer, and the target quiescent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvhandoff.conformance import adversary
from kvhandoff.conformance.registry import counterpart
from kvhandoff.conformance.target import Target, require_one_prefill_rank
from kvhandoff.conformance.validate import Ids, ValidationReport, Validator
from kvhandoff.spec.actions import (
    Action,
    DecodeReceiveCancel,
    PrefillReceiveCancel,
    action_name,
)
from kvhandoff.spec.config import Config
from kvhandoff.spec.machine import enabled
from kvhandoff.spec.state import State
from kvhandoff.spec.variants import REFERENCE, Variant


class Divergence(AssertionError):
    """The target did something the spec cannot explain, or broke a property."""

    def __init__(self, kind: str, prop: str, message: str, detail: Any = None) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.property = prop
        self.message = message
        self.detail = detail


def drive(target: Target, action: Action) -> bool:
    """Perform a spec action on the target; False when the target has no counterpart now.

    What each action is on a target is one row of `conformance.registry`; an action with no row
    (a variant's own action) has no counterpart.
    """
    row = counterpart(action)
    return False if row is None else row.perform(target, action)


@dataclass
class StepRecord:
    action: Action
    performed: bool
    events: int


@dataclass
class Session:
    """One lockstep run of a target against the spec."""

    target: Target
    config: Config
    mode: str
    variant: Variant = REFERENCE
    steps: list[StepRecord] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    probes: bool = True
    """After each step, play a forged prefill against decode (`conformance.adversary`)."""
    probed: int = 0
    probe_outcomes: dict[str, int] = field(default_factory=dict)
    """`attack:reaction` -> how many probes got it (for coverage)."""

    def __post_init__(self) -> None:
        require_one_prefill_rank(
            self.config, retries=self.target.retries, instances=self.target.instances
        )
        self.target.start(self.config, self.mode)
        ids = Ids(self.config.page_size)
        for r in range(len(self.config.requests)):
            ids.requests[self.target.request_id(r)] = r
        self.validator = Validator(self.config, ids, self.variant)
        self._absorb()

    @property
    def state(self) -> State:
        return next(iter(self.validator.frontier))

    def enabled(self) -> list[Action]:
        return enabled(self.variant, self.config, self.state)

    def _absorb(self) -> None:
        for ev in self.target.take_events():
            self.events.append(ev)
            if not self.validator.feed(ev):
                rep = self.validator.report()
                raise Divergence(
                    "unexplained_event" if not rep.violated else "property",
                    rep.violated[0] if rep.violated else "conformance",
                    rep.message,
                    rep,
                )
        self._check_canaries()
        self._check_pages()

    def explained_actions(self) -> tuple[Action, ...]:
        """The spec actions that explain the target's events so far (one explanation)."""
        from kvhandoff.conformance.validate import flatten_history

        return flatten_history(next(iter(self.validator.frontier.values()), ()))

    def _check_pages(self) -> None:
        """A page may hold data only where the spec says that same write's data is (a freed
        page is zeroed: `freed_pages_hold_no_readable_data`). Holding less is allowed: a target
        may zero more than the spec requires (a restarted decode's pool, say)."""
        contents = self.target.page_contents()
        if contents is None:
            return
        held = {p: w for p, w in contents.items() if w is not None}
        if not held:
            return
        names = {self.target.request_id(r): r for r in range(len(self.config.requests))}
        for s in self.validator.frontier:
            if all(_holds(s, p, names.get(w)) for p, w in held.items()):
                return
        s = self.state
        bad = {p: (w, s.pages[p].content if p < len(s.pages) else None) for p, w in held.items()}
        raise Divergence(
            "data",
            "freed_pages_hold_no_readable_data",
            "decode pages hold data the spec says is not there (page: target's writer, spec's "
            f"content): {bad}",
        )

    def _check_canaries(self) -> None:
        for r, ans in self.target.answers().items():
            for writer, tenant in ans.foreign:
                raise Divergence(
                    "isolation",
                    "no_cross_tenant_read",
                    f"answer to {self.target.request_id(r)} (tenant "
                    f"{self.config.requests[r].tenant}) carries the canary of {writer} "
                    f"(tenant {tenant})",
                    {"reader": self.target.request_id(r), "writer": writer},
                )

    def do(self, action: Action) -> bool:
        performed = drive(self.target, action)
        before = len(self.events)
        self._absorb()
        cancel = isinstance(action, DecodeReceiveCancel | PrefillReceiveCancel)
        if performed and cancel and len(self.events) == before:
            # The worker no longer knew the request and logged nothing: the spec step happened
            # all the same (a no-op there).
            self.validator.take_silent(action)

        self.steps.append(StepRecord(action, performed, len(self.events) - before))
        row = counterpart(action)
        if performed and row is not None and row.logs_at_once and self.target.fine_grained:
            logged = {str(ev.get("event")) for ev in self.events[before:]}
            if not logged & set(row.events):
                raise Divergence(
                    "missing_event",
                    "conformance",
                    f"the target performed {action_name(action)} but logged none of "
                    f"{', '.join(row.events)} (it logged: {', '.join(sorted(logged)) or 'nothing'})",
                )
        if self.probes:
            self._probe()
        return performed

    def _probe(self) -> None:
        """Forged messages against decode, each judged by the spec's reaction to it."""
        state = self.state
        for attack in adversary.attacks_for(state):
            want = adversary.expected(self.variant, self.config, state, attack)
            if want is None:
                continue
            got = self.target.probe(attack)
            if got is None:
                if attack.kind == adversary.ATTACKS[0] and not self.probed:
                    return  # this target cannot probe at all
                continue
            self.probed += 1
            pair = f"{attack.kind}:{got.outcome}"
            self.probe_outcomes[pair] = self.probe_outcomes.get(pair, 0) + 1
            problem = adversary.judge(attack, want, got)
            if problem is not None:
                raise Divergence("adversarial", want.prop, problem, attack)

    def finish(self) -> None:
        """Settle the target and run the final checks."""
        self.target.settle()
        self._absorb()
        answers = self.target.answers()
        for r in range(len(self.config.requests)):
            rid = self.target.request_id(r)
            submitted = any(
                ev["event"] in ("router_submit_request", "router_reject_request")
                and ev["args"].get("request_id") == rid
                for ev in self.events
            )
            if submitted and r not in answers:
                raise Divergence(
                    "no_answer",
                    "every_request_terminates",
                    f"{rid} was submitted and never answered after the target settled",
                )
        if not self.target.quiescent():
            raise Divergence(
                "not_quiescent",
                "every_request_terminates",
                "the target settled with requests in progress or decode pages held: "
                + self.target.describe(),
            )
        for r, ans in answers.items():
            if not ans.ok:
                continue
            ok_states = [s for s in self.validator.frontier if _reads_agree(s, r, ans.read)]
            if not ok_states:
                spec_read = self.state.requests[r].read
                raise Divergence(
                    "data",
                    "decode_reads_only_validated_pages",
                    f"{self.target.request_id(r)} was answered from pages holding "
                    f"{ans.read}; the spec read {spec_read}",
                )


def _holds(s: State, page: int, writer: int | None) -> bool:
    """The spec's page `page` holds data written by request `writer`."""
    if page >= len(s.pages):
        return False
    content = s.pages[page].content
    return content is not None and content.request == writer


def _reads_agree(s: State, r: int, read: list[str | None]) -> bool:
    spec = s.requests[r].read
    if spec is None:
        return False
    return [t.tenant if t is not None else None for t in spec] == list(read)


def run_program(
    target: Target,
    config: Config,
    mode: str,
    choose: Callable[[list[Action]], Action | None],
    steps: int,
    variant: Variant = REFERENCE,
) -> Session:
    """Run `steps` spec-chosen steps (`choose` picks one of the enabled actions, or None to
    stop), then settle and check. Raises `Divergence` on the first disagreement."""
    session = Session(target, config, mode, variant)
    for _ in range(steps):
        options = session.enabled()
        if not options:
            break
        action = choose(options)
        if action is None:
            break
        session.do(action)
    session.finish()
    return session


def program_names(session: Session) -> list[str]:
    return [action_name(s.action) for s in session.steps]


__all__ = ["Divergence", "Session", "StepRecord", "drive", "run_program"]


def report_of(exc: Divergence) -> ValidationReport | None:
    return exc.detail if isinstance(exc.detail, ValidationReport) else None


def machine_for(
    target_factory: Callable[[], Target], config: Config, mode: str = "reference"
) -> type:
    """A Hypothesis `RuleBasedStateMachine` (DatabaseComparison style) for a target: one rule
    that draws a spec action from what the spec enables (`st.sampled_from`, so failures shrink
    towards protocol steps), performs it on the target and checks the target's events; the
    teardown settles the target and runs the final checks.

        TestConformance = machine_for(InProcTarget, campaign_config()).TestCase
    """
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, rule

    class ConformanceMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.session = Session(target_factory(), config, mode)

        @rule(data=st.data())
        def spec_step(self, data: st.DataObject) -> None:
            options = self.session.enabled()
            if options:
                self.session.do(data.draw(st.sampled_from(options), label="action"))

        def teardown(self) -> None:
            try:
                self.session.finish()
            finally:
                self.session.target.close()

    return ConformanceMachine
