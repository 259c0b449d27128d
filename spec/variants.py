"""The reference protocol, the incident, and the catalogue of real bugs, as values.

A protocol is a `Design`: a handful of named options, each one a decision that some real engine made
one way or the other (see `reference/engines.md`). The reference protocol takes the safe choice of
each; a *variant* flips a few of them, or overrides or adds an action in a few lines of Python.
Every engine (explicit search, Z3, conformance) takes the variant as input and runs unchanged.

Many real bugs are harmless on their own against the reference protocol's other defences. That is
the point of defence in depth, and it is also why each catalogue variant below flips *the smallest
set of options that makes its bug observable*, and says which defence had to go for it to show.
A bug may also need a scenario to show: a variant can name the config fields its catalogue entry
is checked with (`config=`, e.g. two prefill ranks for a rank-quorum bug).

To write your own, make a Python file that defines `VARIANT = Variant(...)` (start from
`REFERENCE.derive(...)`) and pass its path to `kvhandoff check --variant PATH.py`; see
`docs/variants.md` and `examples/variant_skip_digest.py`.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any, Literal, get_args, get_type_hints

from kvhandoff.spec.actions import ACTIONS_BY_NAME, FAULT_ACTIONS, snake_case
from kvhandoff.spec.config import SCENARIOS, Config, ConfigError
from kvhandoff.spec.effects import EffectFormula, ack_dinst
from kvhandoff.spec.logic import DINST, PINST, GuardFormula, Var
from kvhandoff.spec.properties import ALL_PROPERTY_NAMES
from kvhandoff.spec.state import MessageKind, State, evolve

Oversize = Literal["reject", "placeholder", "truncate"]
Completion = Literal["granted", "local"]
Validation = Literal["full", "count_only", "digest_optional", "none"]
WritePath = Literal["receiver_checked", "one_sided"]
Fence = Literal["generation", "drain_ack", "ack_or_timeout", "none"]
Transfer = Literal["push", "pull"]
Quorum = Literal["every_rank", "first_rank"]
Matching = Literal["request", "room"]
LoadFailure = Literal["fail", "recompute"]


class VariantError(ValueError):
    """A variant is malformed: a design option set to a value it does not take, a `breaks` name
    that is no property, a `config` key that is no config field, an override of no action.

    Why so strict: a variant is a claim about a protocol, and a typo in it must not quietly turn
    into a different protocol. `validation="count-only"` (a hyphen) used to be "not one of the
    weak choices", so decode validated fully and a broken design was reported safe. The message
    names the option, the value and what is allowed, with the nearest allowed value when the
    value looks like a typo of one."""


def _did_you_mean(value: object, allowed: Iterable[object]) -> str:
    close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _quoted(values: Iterable[object]) -> str:
    return ", ".join(repr(v) for v in values)


@dataclass(frozen=True)
class Design:
    """The protocol's design options. Defaults are the reference protocol's choices."""

    oversize: Oversize = "reject"
    """Prefill's answer to a prompt over its limit: reject it (tell decode and the client, write
    nothing); swap it for a one-page placeholder and carry on (SGLang's `set_finish_with_abort`,
    M1); or silently truncate it (`--allow-auto-truncate` on prefill only, M6)."""
    completion: Completion = "granted"
    """When prefill's completion says "done": after writing the pages it has for the grant, with the
    count it really wrote (`granted`); or, as in SGLang's `is_last_chunk`, after the pages of *its
    own* view of the prompt, claiming the whole grant is covered (`local`, M2)."""
    validation: Validation = "full"
    """What decode checks before it generates: page count and a digest recomputed over every granted
    page (`full`); the count only (`count_only`); the digest only if one was sent
    (`digest_optional`, M5); nothing but the room and generation (`none`, M3)."""
    prefill_sends_digest: bool = True
    check_generation: bool = True
    """Decode matches a completion by room *and* generation; False matches by room only (M10)."""
    write_path: WritePath = "receiver_checked"
    """`receiver_checked`: decode accepts a page write only into a page it owns for that room and
    generation (our gRPC path). `one_sided`: the write lands wherever it points (RDMA WRITE)."""
    release_fence: Fence = "generation"
    """What stops a write of a released generation from landing later: decode's ownership check
    (`generation`, needs the receiver-checked path); waiting for prefill's drain ack after an
    abort (`drain_ack`); that ack or a timeout (`ack_or_timeout`, M8); nothing (`none`, M7)."""
    scrub: bool = True
    """Zero pages when they are freed (and the pool when decode restarts); False is M20."""
    prefill_abort_notifies_decode: bool = True
    """A prefill-side abort is told to decode; False is M15 (decode waits for its timeout)."""
    router_honours_prefill_error: bool = True
    """The router answers the client with prefill's error; False returns decode's answer (M16)."""
    placeholder_reports_error: bool = False
    """With `oversize="placeholder"`: prefill's response to the router is the abort error (as after
    sglang #33507) rather than a spurious success (0.5.11's FINISH_LENGTH, the incident)."""
    prefill_adopts_unknown_grant: bool = False
    """Prefill creates transfer state for a grant whose request it does not hold (M18)."""
    generations_persist: bool = True
    """Decode's generation counter survives a restart; False restarts it at 1."""
    transfer: Transfer = "push"
    """`push`: prefill writes into decode's pages (SGLang, Mooncake). `pull`: decode reads prefill's
    pinned blocks (vLLM's NIXL connector). On the pull path the data a transfer delivers is what
    the source block holds *when the read lands*, the source is pinned by a lease that can expire
    (a fault), and a read can fail (a fault) where the reader sees it."""
    lease_expiry_notifies_decode: bool = True
    """Pull: when prefill's lease on a request's blocks expires, it tells decode (False: only a
    log line on prefill, M13)."""
    transfer_failure_reported: bool = True
    """Pull: a failed read fails the request (False: decode carries on as if the page arrived,
    M14)."""
    matching: Matching = "request"
    """How a worker finds the request a grant, an abort or a failure notice is for: by the request
    id the message carries and the room (`request`: our implementation, which keys transfer state
    by both), or by the room (and generation) alone (`room`: SGLang keys it by `bootstrap_room`,
    which the router picks per request and a client can choose, so two requests can share one)."""
    binds_request: bool = True
    """Decode accepts a page write or a completion only if it names the request decode holds the
    pages for (our implementation's writes and completions carry the request id, checked with the
    grant's capability token). False: a write or completion is matched by room and generation
    only, so data written for another request sharing the room is taken for this one's."""
    completion_quorum: Quorum = "every_rank"
    """How many prefill ranks' completions decode waits for before it accepts the transfer:
    every rank's (`every_rank`, as SGLang's `len(prefill_response_tracker[room]) >=
    required_prefill_response_num` with the count taken from prefill's topology), or the first
    one to arrive (`first_rank`: the required count computed as 1). With one prefill rank the two
    are the same protocol."""
    attempt_fence: bool = True
    """Where a worker matches a grant, an abort or a failure notice by request id
    (`matching="request"`), it also checks the attempt number the message carries against the
    one the router handed it with the request: a message of a retried request's first attempt
    is stale for the second. False: the request id alone (`retry_reuses_request_id`)."""

    fence_survives_suspicion: bool = True
    """When decode's health check takes prefill for dead (a partition: prefill may be alive,
    `decode_suspect_prefill_dead`), the requests decode fails keep the release fence of its
    design: on a drain-fenced design their pages wait for prefill's drain ack, which comes once
    the partition heals and the abort gets through. False: decode releases them without the ack,
    reasoning that a dead writer's writes cannot land (our implementation's
    `_fail_after_prefill_loss`, safe there only because decode checks every write; SGLang's
    deferred release resolves on its 30 s timeout after heartbeat loss). Matters only where
    release waits for the drain ack."""

    fence_on_prefill_failure: bool = True
    """On a drain-fenced design, a failure notice from prefill for a grant decode holds fences
    release like decode's own abort: decode sends the abort for the generation and frees the pages
    only on prefill's drain ack (SGLang: after an RDMA or session failure's Failed status, the
    deferred release waits for the ack). The notice says prefill stopped, not that its writes
    drained: a failed write does not recall the others (`prefill_write_error`). False: decode
    releases at once (`release_on_prefill_failure`). Matters only where release waits for the
    drain ack."""

    load_failure: LoadFailure = "fail"
    """Pull: what decode does when a read of a page fails. `fail`: the request fails (vLLM's
    `kv_load_failure_policy="fail"`, its default since PR #34896). `recompute`: decode computes
    the prompt's KV into the pages it holds itself and goes on to generate without prefill's
    completion (vLLM's `recompute`, which rolls the request back to its last valid prefix and
    prefills the rest locally; the model recomputes every page)."""
    recompute_fence: bool = True
    """With `load_failure="recompute"`: decode takes a fresh generation for the pages it
    recomputes, so that a read of the failed transfer still in flight is refused when it lands
    (the generation fence, on the receiver-checked path). A failed read does not stop the
    request's other reads: vLLM retains the NIXL handles it cannot release ("A status error does
    not guarantee that the backend stopped DMA"). False: the recomputed pages keep the grant's
    generation, and a read that lands after the recompute overwrites a recomputed page with
    whatever the source block holds by then."""

    @property
    def drain_fenced(self) -> bool:
        """Decode's release after an abort waits for prefill's drain ack (`drain_ack`; or
        `ack_or_timeout`, where a timeout may stand in for it, M8): the designs whose aborts
        prefill must acknowledge once its writes drained."""
        return self.release_fence in ("drain_ack", "ack_or_timeout")

    def __post_init__(self) -> None:
        # Every option is a closed choice: the Literal (or bool) it is declared with lists the
        # values the engines know. Anything else is rejected here, so a catalogue entry, a
        # `derive`, a `replace` and a user's file are all checked the same way.
        for name, allowed in _design_choices().items():
            value = getattr(self, name)
            if allowed == (True, False):
                # `1 == True` in Python: insist on a real bool, or `scrub=0` would pass.
                if not isinstance(value, bool):
                    raise VariantError(
                        f"design option {name}={value!r} must be True or False "
                        f"(got {type(value).__name__} {value!r})"
                    )
            elif not isinstance(value, str) or value not in allowed:
                raise VariantError(
                    f"design option {name}={value!r} is not one of {_quoted(allowed)}"
                    + _did_you_mean(value, allowed)
                )


@cache
def _design_choices() -> dict[str, tuple[object, ...]]:
    """Each design option's allowed values, read from its type annotation."""
    hints = get_type_hints(Design)
    out: dict[str, tuple[object, ...]] = {}
    for f in dataclasses.fields(Design):
        hint = hints[f.name]
        out[f.name] = (True, False) if hint is bool else get_args(hint)
    return out


EnabledHook = Callable[[Config, State], Iterable[Any]]
StepHook = Callable[[Config, State, Any], State]


def is_fault_kind(kind: type) -> bool:
    return kind in FAULT_ACTIONS


class FormulaGuard:
    """A variant's guard written as a formula (`spec.logic.guard`), bound to its action and the
    variant's design: called like a Python guard, `(config, state) -> actions`, by compiling the
    formula once; the Z3 encodings read `formula` instead of the rulebook's guard."""

    def __init__(self, name: str, kind: type, formula: GuardFormula, design: Design) -> None:
        self.name, self.kind, self.formula = name, kind, formula
        self.drain = design.drain_fenced
        self._fn: Callable[..., bool] | None = None

    def __call__(self, config: Config, state: State) -> list[Any]:
        if self._fn is None:
            from kvhandoff.spec.vocabulary import compile_claim

            self._fn = compile_claim(self.formula.formula, self.name, self.formula.params)
        fn, drain = self._fn, self.drain
        if not self.formula.params:
            return [self.kind()] if fn(state, config, drain) else []
        if is_instance_step(self.formula):  # a step of one instance (or pair): each of them
            return [
                self.kind(*values)
                for values in instance_arguments(self.formula, config)
                if fn(state, config, drain, *values)
            ]
        if len(self.formula.params) == 2 and "generation" in _field_names(self.kind):
            # A drain ack: each (room, generation) owed, by the requests that owe it, per rank,
            # named with the decode instance its abort came from (as `enabled` names it).
            return [
                self.kind(room, gen, k, ack_dinst(config, state, r))
                for room, gen, r in state.pending_acks
                for k in range(config.prefill_ranks)
                if fn(state, config, drain, r, k)
            ]
        if len(self.formula.params) == 2:  # a step each prefill rank takes for a request
            ranks = range(config.prefill_ranks)
            return [
                self.kind(r, k)
                for r in range(len(state.requests))
                for k in ranks
                if fn(state, config, drain, r, k)
            ]
        if self.formula.source == "writes":  # a step that takes a write: each distinct one
            return [self.kind(w) for w in sorted(set(state.writes)) if fn(state, config, drain, w)]
        if self.formula.source:  # a step that takes a message: each distinct one, in order
            pool = state.network if self.formula.source == "network" else state.lost
            kinds = self.formula.kinds
            candidates = sorted({m for m in pool if not kinds or m.kind in kinds})
            return [self.kind(m) for m in candidates if fn(state, config, drain, m)]
        return [self.kind(r) for r in range(len(state.requests)) if fn(state, config, drain, r)]

    def __repr__(self) -> str:
        return f"FormulaGuard({self.name}: {self.formula!r})"


class FormulaEffect:
    """A variant's effect written as a formula (`spec.effects.effect`), bound to its action and
    the variant's design: called like a Python effect, `(config, state, action) -> state`, by
    running the formula (`spec.effects.run_effect`); the Z3 encodings translate `formula` in
    place of the rulebook's effect."""

    def __init__(self, name: str, kind: type, formula: EffectFormula, design: Design) -> None:
        self.name, self.kind, self.formula = name, kind, formula
        self.drain = design.drain_fenced

    def __call__(self, config: Config, state: State, action: Any) -> State:
        from kvhandoff.spec.effects import run_effect

        return run_effect(self.formula, config, state, self.drain, arguments(action, state, config))

    def __repr__(self) -> str:
        return f"FormulaEffect({self.name}: {self.formula!r})"


def _field_names(kind: type) -> set[str]:
    import dataclasses

    return {f.name for f in dataclasses.fields(kind)}


_GUARD_SHAPES = {
    "none": "nothing",
    "requests": "requests",
    "ranks": "(request, prefill rank) pairs",
    "drain_acks": "the drain acks prefill owes, per rank",
    "writes": "page writes in flight",
    "messages": "messages",
    "instances": "instances (one, or a decode and a prefill instance)",
}
_GUARD_FORMS = {
    "none": "guard(lambda: ...)",
    "requests": "guard(lambda r: ...)",
    "ranks": "rank_guard(lambda r, k: ...)",
    "drain_acks": "rank_guard(lambda r, k: ...) over the request owing the ack and the rank",
    "writes": "write_guard(lambda w: ...)",
    "messages": 'message_guard("network", (KIND,), lambda m: ...)',
    "instances": "instance_guard((PINST or DINST, ...), lambda ...: ...), in the action's field order",
}
_EFFECT_SHAPES = {
    "none": "nothing",
    "request": "one request",
    "rank": "a request and a prefill rank",
    "message": "a message",
    "write": "a page write",
    "instances": "instances (one, or a decode and a prefill instance)",
}
_EFFECT_FORMS = {
    "none": "effect(lambda: [...])",
    "request": "effect(lambda r: [...])",
    "rank": "effect(lambda r, k: [...])",
    "message": "message_effect(lambda m: [...])",
    "write": "write_effect(lambda w: [...])",
    "instances": "instance_effect((PINST or DINST, ...), lambda ...: [...])",
}
FAULT_COUNTS = frozenset(
    {
        "cancels_spent",
        "timeouts_spent",
        "prefill_aborts_spent",
        "crashes_spent",
        "drops_spent",
        "duplicates_spent",
        "partitions_spent",
        "write_errors_spent",
    }
)
"""The fault counts a fault's effect spends (their sum is `faults_spent`)."""


def _effect_shape(formula: EffectFormula) -> str:
    """What an effect formula takes: nothing, a request, a request and a rank, a message or a
    write (a message's or write's fields are a `Bound` of that kind)."""
    from kvhandoff.spec.logic import Bound

    if not formula.params:
        return "none"
    first = formula.params[0]
    if isinstance(first, Bound):
        return "write" if first.what_of == "write" else "message"
    if first.sort in (PINST, DINST):
        return "instances"
    return "rank" if len(formula.params) == 2 else "request"


def arguments(action: Any, state: State, config: Config | None = None) -> tuple[Any, ...]:
    """The arguments a formula of the action's kind takes: its message, its write, its request
    (and rank), or nothing. A drain ack names the abort it answers by room, generation and the
    decode instance it came from; its formula takes the first request that owes that ack (every
    request owing it gets one). `config` is needed only with several decode instances."""
    for name in ("message", "write"):
        if hasattr(action, name):
            return (getattr(action, name),)
    if hasattr(action, "generation") and hasattr(action, "room"):
        aborted = (action.room, action.generation)
        owing = next(
            (
                a[2]
                for a in state.pending_acks
                if a[:2] == aborted
                and (config is None or ack_dinst(config, state, a[2]) == action.dinst)
            ),
            None,
        )
        if owing is None:
            raise ValueError(
                f"{action!r}: no request owes a drain ack for room and generation {aborted}"
            )
        return (owing, action.rank)
    if hasattr(action, "rank") and hasattr(action, "request"):
        return (action.request, action.rank)
    if hasattr(action, "pinst") or hasattr(action, "dinst"):
        # A step of one instance or pair: its instance fields, in order.
        return tuple(getattr(action, f.name) for f in dataclasses.fields(action))
    return (action.request,) if hasattr(action, "request") else ()


def is_instance_step(formula: GuardFormula) -> bool:
    """Does the guard range over instances (`spec.logic.instance_guard`)?"""
    return bool(formula.params) and all(
        isinstance(v, Var) and v.sort in (PINST, DINST) for v in formula.params
    )


def instance_arguments(formula: GuardFormula, config: Config) -> list[tuple[int, ...]]:
    """Every value of an instance step's arguments in `config`, in order."""
    counts = [
        config.prefill_instances if v.sort == PINST else config.decode_instances
        for v in formula.params
    ]
    return list(itertools.product(*(range(n) for n in counts)))


@dataclass(frozen=True)
class Variant:
    """A protocol: a design, plus optional action overrides, with its catalogue entry."""

    name: str
    summary: str
    explanation: str = ""
    m_numbers: tuple[str, ...] = ()
    breaks: tuple[str, ...] = ()
    """Properties this variant is expected to violate (empty: expected safe)."""
    design: Design = Design()
    extra_actions: EnabledHook | None = None
    """Adds actions to `enabled` (after the protocol's own, before faults)."""
    step_overrides: Mapping[str, StepHook] = field(default_factory=dict)
    """Replaces the effect of the named actions (snake_case names)."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """Config fields the variant's catalogue entry is checked with, over the scenario it starts
    from (e.g. `{"prefill_ranks": 2}` for a bug only several ranks can show); see `scenario`."""
    scenario_name: str | None = None
    """The named scenario (`spec.config.SCENARIOS`) the CLI checks this variant on when the user
    names none; None: the CLI's default, `wide`. A variant names `sequential` when its search on
    `wide` takes minutes (a retry multiplies the states of two requests in flight)."""
    guard_overrides: Mapping[str, EnabledHook] = field(default_factory=dict)
    """Replaces the guard of the named actions (snake_case names): the hook lists the actions of
    that kind enabled in a state, with their arguments, in place of the rulebook's own guard
    (a fault stays within the fault budget)."""
    state_fields: Mapping[str, Any] = field(default_factory=dict)
    """State the variant adds, by name, with its initial value (a hashable value: an int, a
    bool, a tuple). Read it with `variant.get(state, name)` and write it with
    `variant.put(state, name, value)` in the variant's guards and effects; the explorer keeps it
    in every state it stores, so it must stay finite."""
    extra_action_types: tuple[type, ...] = ()
    """The classes of the actions `extra_actions` adds (frozen dataclasses, like the spec's own).
    Listing them lets a trace of this variant be read back (`explain`, `replay`), and each needs
    its effect in `step_overrides` under its snake_case name."""

    def __post_init__(self) -> None:
        # The checks a reviewer's typo would otherwise slip past: each turns a variant that is not
        # what its author meant into an error that says so (see `VariantError`).
        if not isinstance(self.design, Design):
            raise VariantError(
                f"variant {self.name!r}: design must be a Design, got {self.design!r}"
            )
        for label, names in (("breaks", self.breaks), ("m_numbers", self.m_numbers)):
            if isinstance(names, str):
                # A bare string is a sequence of letters: ("x") is "x", not ("x",).
                raise VariantError(
                    f"variant {self.name!r}: {label}= takes a tuple of names, got the string "
                    f"{names!r} (write {label}=({names!r},))"
                )
        for prop in self.breaks:
            if prop not in ALL_PROPERTY_NAMES:
                raise VariantError(
                    f"variant {self.name!r}: breaks= names {prop!r}, which is not a property"
                    f"{_did_you_mean(prop, ALL_PROPERTY_NAMES)}; properties: "
                    f"{', '.join(ALL_PROPERTY_NAMES)}"
                )
        self._check_config()
        self._check_actions()
        self._check_guards_and_fields()

    def _check_guards_and_fields(self) -> None:
        added = [snake_case(t.__name__) for t in self.extra_action_types]
        bound: dict[str, Any] = {}
        for name, hook in self.guard_overrides.items():
            if isinstance(hook, (GuardFormula, FormulaGuard)):
                bound[name] = self._bind_formula_guard(name, hook)
                continue
            if name not in ACTIONS_BY_NAME:
                hint = (
                    " (an added action's guard is its extra_actions hook, or a formula "
                    "guard(...) here)"
                    if name in added
                    else ""
                )
                raise VariantError(
                    f"variant {self.name!r}: guard_overrides names {name!r}, which is no action "
                    f"of the rulebook{_did_you_mean(name, ACTIONS_BY_NAME)}{hint}"
                )
            if not callable(hook):
                raise VariantError(
                    f"variant {self.name!r}: guard_overrides[{name!r}] must be a function "
                    f"(config, state) -> actions, got {hook!r}"
                )
        if bound:
            # The formula guards, bound to their action and this design: callable like a Python
            # guard (the explorer), readable as formulas (the Z3 encodings).
            object.__setattr__(self, "guard_overrides", {**self.guard_overrides, **bound})
        # The guards of added actions written as formulas: `enabled` lists their actions after
        # the protocol's own (with `extra_actions`).
        added_guards = tuple(
            h for n, h in self.guard_overrides.items() if n in added and isinstance(h, FormulaGuard)
        )
        object.__setattr__(self, "_added_guards", added_guards)
        for name in added:
            if self.extra_actions is None and name not in self.guard_overrides:
                raise VariantError(
                    f"variant {self.name!r}: added action {name!r} has no guard: list it in "
                    "extra_actions (a Python function) or give it a formula guard in "
                    f"guard_overrides={{{name!r}: guard(lambda r: ...)}}"
                )
        for name, initial in self.state_fields.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise VariantError(
                    f"variant {self.name!r}: state field name {name!r} must be an identifier"
                )
            try:
                hash(initial)
            except TypeError:
                raise VariantError(
                    f"variant {self.name!r}: state field {name!r} starts as {initial!r}, which "
                    "is not hashable (states are compared and stored: use an int, a bool, a str "
                    "or a tuple)"
                ) from None

    def get(self, state: State, name: str) -> Any:
        """The value of the variant's own state field `name` in `state`."""
        for key, value in state.variant_fields:
            if key == name:
                return value
        try:
            return self.state_fields[name]
        except KeyError:
            raise VariantError(
                f"variant {self.name!r} has no state field {name!r}"
                f"{_did_you_mean(name, self.state_fields)}; declare it in state_fields="
            ) from None

    def put(self, state: State, name: str, value: Any) -> State:
        """`state` with the variant's state field `name` set to `value`.

        A field at its initial value is not stored, so a state is the same object whatever
        variant looks at it, and the reference's states are untouched by the mechanism."""
        if name not in self.state_fields:
            self.get(state, name)  # raises, naming the field
        fields = {k: v for k, v in state.variant_fields if k != name}
        if value != self.state_fields[name]:
            fields[name] = value
        return evolve(state, variant_fields=tuple(sorted(fields.items())))

    def _check_config(self) -> None:
        if self.scenario_name is not None and self.scenario_name not in SCENARIOS:
            raise VariantError(
                f"variant {self.name!r}: scenario_name {self.scenario_name!r} is not a named "
                f"scenario; known: {', '.join(SCENARIOS)}"
            )
        fields = [f.name for f in dataclasses.fields(Config)]
        for key in self.config:
            if key not in fields:
                raise VariantError(
                    f"variant {self.name!r}: config= key {key!r} is not a config field"
                    f"{_did_you_mean(key, fields)}; fields: {', '.join(fields)}"
                )
        try:
            replace(Config(), **self.config)  # the values, checked by Config itself
        except (ConfigError, TypeError) as exc:
            raise VariantError(f"variant {self.name!r}: config= {exc}") from None

    def _check_actions(self) -> None:
        added = {snake_case(t.__name__): t for t in self.extra_action_types}
        for name, cls in added.items():
            if not dataclasses.is_dataclass(cls) or not isinstance(cls, type):
                raise VariantError(
                    f"variant {self.name!r}: extra_action_types lists {cls!r}, which is not a "
                    "dataclass class (write @dataclass(frozen=True) class MyAction: ...)"
                )
            if name in ACTIONS_BY_NAME:
                raise VariantError(
                    f"variant {self.name!r}: added action {cls.__name__} has the name of the "
                    f"spec's own action {name!r}; to change that action, override its step"
                )
            if name not in self.step_overrides:
                raise VariantError(
                    f"variant {self.name!r}: added action {cls.__name__} has no effect: give it "
                    f"one in step_overrides={{{name!r}: ...}}"
                )
        known = [*ACTIONS_BY_NAME, *added]
        bound: dict[str, FormulaEffect] = {}
        for name, hook in self.step_overrides.items():
            if isinstance(hook, (EffectFormula, FormulaEffect)):
                bound[name] = self._bind_formula_effect(name, hook)
                continue
            if name not in known:
                hint = (
                    " (an added action's class goes in extra_action_types)"
                    if self.extra_actions is not None
                    else ""
                )
                raise VariantError(
                    f"variant {self.name!r}: step_overrides names {name!r}, which is no action"
                    f"{_did_you_mean(name, known)}{hint}"
                )
            if not callable(hook):
                raise VariantError(
                    f"variant {self.name!r}: step_overrides[{name!r}] must be a function "
                    f"(config, state, action) -> state, got {hook!r}"
                )
        if bound:
            object.__setattr__(self, "step_overrides", {**self.step_overrides, **bound})
        if self.extra_actions is not None and not callable(self.extra_actions):
            raise VariantError(
                f"variant {self.name!r}: extra_actions must be a function (config, state) -> "
                f"actions, got {self.extra_actions!r}"
            )

    def derive(self, name: str, summary: str, **changes: Any) -> Variant:
        """A new variant: this one with the given design options (and catalogue fields) changed."""
        design_fields = set(Design.__dataclass_fields__)
        variant_fields = set(Variant.__dataclass_fields__) - {"name", "summary", "design"}
        for key in changes:
            if key not in design_fields | variant_fields:
                allowed = sorted(design_fields | variant_fields)
                raise VariantError(
                    f"derive({name!r}): {key!r} is neither a design option nor a variant field"
                    f"{_did_you_mean(key, allowed)}; design options: "
                    f"{', '.join(Design.__dataclass_fields__)}"
                )
        design_changes = {k: v for k, v in changes.items() if k in design_fields}
        other = {k: v for k, v in changes.items() if k not in design_fields}
        return replace(
            self,
            name=name,
            summary=summary,
            design=replace(self.design, **design_changes),
            **other,
        )

    def _added_kinds(self) -> dict[str, type]:
        return {snake_case(t.__name__): t for t in self.extra_action_types}

    @property
    def added_guards(self) -> tuple[FormulaGuard, ...]:
        """The formula guards of the actions this variant adds (`extra_action_types`)."""
        out: tuple[FormulaGuard, ...] = self.__dict__.get("_added_guards", ())
        return out

    def _bind_formula_guard(self, name: str, hook: GuardFormula | FormulaGuard) -> FormulaGuard:
        formula = hook.formula if isinstance(hook, FormulaGuard) else hook
        kind = ACTIONS_BY_NAME.get(name) or self._added_kinds().get(name)
        if kind is None:
            raise VariantError(
                f"variant {self.name!r}: guard_overrides names {name!r}, which is no action of "
                f"the rulebook{_did_you_mean(name, ACTIONS_BY_NAME)}"
            )
        if name in ACTIONS_BY_NAME:
            # A rulebook action: the formula must range over what the rulebook's guard ranges
            # over (a request, a request and a rank, a message, a write, a drain ack owed, or
            # nothing), so that every engine binds its arguments the same way.
            from kvhandoff.spec.compiled import _shape
            from kvhandoff.spec.machine import rule_guard

            rulebook = rule_guard(self.design, name)
            want, got = _shape(rulebook, kind), _shape(formula, kind)
            if want != got:
                raise VariantError(
                    f"variant {self.name!r}: guard_overrides[{name!r}] ranges over "
                    f"{_GUARD_SHAPES[got]}, but {kind.__name__} is enabled per "
                    f"{_GUARD_SHAPES[want]}: write it as {_GUARD_FORMS[want]}"
                )
            if got == "messages":
                self._check_message_source(name, rulebook, formula)
            if is_fault_kind(kind):
                # A fault stays within the run's fault budget whatever its own guard says: the
                # explorer checks the total apart, and the Z3 encodings read it from the guard,
                # so the budget is stated here once for both.
                from kvhandoff.spec.logic import And
                from kvhandoff.spec.vocabulary import faults_spent, max_faults

                budget = faults_spent() < max_faults()
                formula = GuardFormula(
                    formula.params, And(budget, formula.formula), formula.source, formula.kinds
                )
        else:
            fields = [f.name for f in dataclasses.fields(kind)]
            want_fields = (["message"] if formula.source else ["request"]) if formula.params else []
            if fields != want_fields:
                raise VariantError(
                    f"variant {self.name!r}: guard_overrides[{name!r}] is a formula, but an "
                    f"added action's formula guard ranges over one request (guard(lambda r: "
                    f"...)) or nothing (guard(lambda: ...)); {kind.__name__} takes "
                    f"({', '.join(fields)})"
                )
        return FormulaGuard(name, kind, formula, self.design)

    def _check_message_source(self, name: str, rulebook: GuardFormula, mine: GuardFormula) -> None:
        if mine.source != rulebook.source:
            raise VariantError(
                f"variant {self.name!r}: guard_overrides[{name!r}] takes messages from "
                f"{mine.source!r}, but the rulebook's {name} takes them from {rulebook.source!r}"
            )
        every = get_args(MessageKind)
        extra = sorted(set(mine.kinds or every) - set(rulebook.kinds or every))
        if extra:
            raise VariantError(
                f"variant {self.name!r}: guard_overrides[{name!r}] takes {'/'.join(extra)} "
                f"messages, which the rulebook's {name} never takes (its kinds: "
                f"{', '.join(rulebook.kinds) or 'any'}): its effect would not know them"
            )

    def _bind_formula_effect(self, name: str, hook: EffectFormula | FormulaEffect) -> FormulaEffect:
        formula = hook.formula if isinstance(hook, FormulaEffect) else hook
        kind = ACTIONS_BY_NAME.get(name) or self._added_kinds().get(name)
        if kind is None:
            raise VariantError(
                f"variant {self.name!r}: step_overrides names {name!r}, which is no action of "
                f"the rulebook{_did_you_mean(name, ACTIONS_BY_NAME)} or of extra_action_types"
            )
        got = _effect_shape(formula)
        if name in ACTIONS_BY_NAME:
            from kvhandoff.spec.machine import rule_effect

            want = _effect_shape(rule_effect(self.design, name))
            if want != got:
                raise VariantError(
                    f"variant {self.name!r}: step_overrides[{name!r}] takes {_EFFECT_SHAPES[got]}"
                    f", but the effect of {kind.__name__} takes {_EFFECT_SHAPES[want]}: write it "
                    f"as {_EFFECT_FORMS[want]}"
                )
            spent = sorted(formula.written & FAULT_COUNTS)
            if is_fault_kind(kind) and not spent:
                # Without it a run could take the fault for ever: the explorer would not end
                # and the Z3 encodings' fault counts would no longer bound it.
                raise VariantError(
                    f"variant {self.name!r}: step_overrides[{name!r}] is the effect of a fault, "
                    "so it must spend the fault budget, as the rulebook's does: add "
                    "assign(X_spent(), X_spent() + 1) for one of "
                    f"{', '.join(sorted(FAULT_COUNTS))}"
                )
        elif got not in ("none", "request"):
            raise VariantError(
                f"variant {self.name!r}: step_overrides[{name!r}] is a formula, but an added "
                "action's formula effect takes one request (effect(lambda r: ...)) or nothing "
                f"(effect(lambda: ...)); this one takes {_EFFECT_SHAPES[got]}"
            )
        return FormulaEffect(name, kind, formula, self.design)

    def formula_effects(self) -> dict[str, FormulaEffect]:
        """The effects this variant replaces with formulas (every fixed-config engine reads
        those)."""
        return {n: h for n, h in self.step_overrides.items() if isinstance(h, FormulaEffect)}

    def formula_guards(self) -> dict[str, FormulaGuard]:
        """The guards this variant replaces with formulas (every engine reads those)."""
        return {n: h for n, h in self.guard_overrides.items() if isinstance(h, FormulaGuard)}

    def rules_key(self) -> tuple[Any, ...]:
        """What the Z3 encodings of this variant depend on: its design and the formulas that
        replace guards (caches keyed by the design alone would answer for another variant)."""
        return (
            self.design,
            tuple(sorted((n, id(h.formula)) for n, h in self.formula_guards().items())),
            tuple(sorted((n, id(h.formula)) for n, h in self.formula_effects().items())),
        )

    def scenario(self, base: Config) -> Config:
        """`base` with the variant's own config fields applied (the CLI's `--set` comes after)."""
        return replace(base, **self.config) if self.config else base

    @property
    def is_pure_design(self) -> bool:
        """True when the variant is only a choice of design options (every engine can encode it)."""
        return not self.untranslated()

    def untranslated(self) -> list[str]:
        """The variant's Python-level constructs, by name: what an engine that translates only
        the rulebook and the design options cannot see (it must refuse the variant, naming
        them, rather than check the rest and call it this variant)."""
        out = [
            f"step_overrides[{name!r}]"
            for name, hook in sorted(self.step_overrides.items())
            if not isinstance(hook, FormulaEffect)
        ]
        out += [
            f"guard_overrides[{name!r}]"
            for name, hook in sorted(self.guard_overrides.items())
            if not isinstance(hook, FormulaGuard)
        ]
        if self.extra_actions is not None:
            hook = getattr(self.extra_actions, "__name__", repr(self.extra_actions))
            out.append(f"extra_actions hook {hook}")
        # A state field is a variable of the Z3 encodings when it is a bool or a non-negative
        # int (a formula reads it through `spec.logic.state_field`).
        out += [
            f"state field {name!r} (starts as {initial!r}: the Z3 encodings keep bools and "
            "non-negative ints)"
            for name, initial in sorted(self.state_fields.items())
            if not (isinstance(initial, int) and (isinstance(initial, bool) or initial >= 0))
        ]
        return out


REFERENCE = Variant(
    name="reference",
    summary="The protocol that must be proved safe.",
    explanation=(
        "Decode reserves pages under a fresh generation and grants them to prefill. Prefill either "
        "rejects (telling decode and the client, writing nothing) or writes every granted page, "
        "tagged with room and generation. Decode accepts a write only into a page it owns for that "
        "room and generation, and before it generates a single token it checks that the completion "
        "covers every granted page and that a digest recomputed over those pages matches the one "
        "prefill sent. Release is fenced by the ownership check, freed pages are zeroed, and the "
        "generation counter survives restarts."
    ),
)

_R = REFERENCE

VARIANTS: tuple[Variant, ...] = (
    REFERENCE,
    _R.derive(
        "incident",
        "The 2026 incident: placeholder rejection, local completion, trusting decode, stale pages.",
        m_numbers=("M1", "M2", "M3", "M6", "M20"),
        breaks=("decode_reads_only_validated_pages", "no_cross_tenant_read"),
        explanation=(
            "A prompt too long for prefill's pool but not for decode's (M6, the config's asymmetric "
            "limits) is swapped by prefill for a one-page placeholder (M1). Prefill writes that one "
            "page and declares the transfer complete by its own count (M2); decode takes the signal "
            "as proof that all its reserved pages were overwritten (M3) and generates from pages "
            "that still hold an earlier tenant's data, because freed pages are not zeroed (M20)."
        ),
        oversize="placeholder",
        completion="local",
        validation="none",
        scrub=False,
    ),
    _R.derive(
        "m1_placeholder_rejection",
        "Prefill's rejection path swaps the prompt for a one-page placeholder and carries on.",
        m_numbers=("M1",),
        breaks=("rejected_request_gets_error_not_output",),
        explanation=(
            "SGLang's `Req.set_finish_with_abort` sets the prompt to one token and leaves the "
            "request queued, so prefill bootstraps, writes and signals completion for a request it "
            "rejected. Against the reference decode the completion fails validation and the client "
            "gets an error, but a rejected request has moved data: fail-closed is already broken."
        ),
        oversize="placeholder",
    ),
    _R.derive(
        "m2_local_completion_count",
        "Prefill declares the transfer complete by its own view of the prompt length.",
        m_numbers=("M2", "M6"),
        breaks=("accepted_completion_implies_full_coverage",),
        explanation=(
            "SGLang computes `is_last_chunk` from prefill's own page count, not from the page list "
            "decode granted. M2 is invisible while both sides agree on the length, so this variant "
            "adds the simplest disagreement (prefill-only auto-truncation, M6), and a decode that "
            "checks only the claimed page count: a digest would catch it."
        ),
        oversize="truncate",
        completion="local",
        validation="count_only",
    ),
    _R.derive(
        "m3_decode_trusts_completion",
        "Decode treats the completion signal as proof of coverage and checks nothing.",
        m_numbers=("M3", "M1"),
        breaks=("decode_reads_only_validated_pages",),
        explanation=(
            "SGLang's decode commits on Success plus a room match; it never compares what was "
            "written with what it reserved (PR #38704 is still open). Prefill's honest page count "
            "would reveal the gap, but nobody looks: with the placeholder path (M1) as the source "
            "of the gap, decode generates from pages no one wrote for this request."
        ),
        oversize="placeholder",
        validation="none",
    ),
    _R.derive(
        "m5_digest_skipped",
        "The integrity check is optional and skipped when prefill sends no digest.",
        m_numbers=("M5", "M2", "M6"),
        breaks=("decode_reads_only_validated_pages",),
        explanation=(
            "SGLang's KV checksum is off by default, must be enabled on both roles, and is skipped "
            "when the expected value is 0 or the layout differs. Here prefill sends no digest and "
            "decode, checking only the count when no digest came, accepts a truncated transfer "
            "(M6) whose completion claims full coverage (M2)."
        ),
        oversize="truncate",
        completion="local",
        validation="digest_optional",
        prefill_sends_digest=False,
    ),
    _R.derive(
        "m6_asymmetric_truncation",
        "Prefill silently truncates a prompt decode admitted whole.",
        m_numbers=("M6",),
        breaks=("rejected_request_gets_error_not_output",),
        explanation=(
            "`--allow-auto-truncate` on prefill only (or different pools) makes prefill admit a "
            "shorter prompt than decode reserved for. The reference decode's validation then fails "
            "the request, but prefill moved data for a prompt it did not admit as sent."
        ),
        oversize="truncate",
    ),
    _R.derive(
        "m7_release_before_drain",
        "Decode frees pages on abort while one-sided writes are still in flight.",
        m_numbers=("M7",),
        breaks=("no_late_write_lands_in_reallocated_page",),
        explanation=(
            "With one-sided RDMA writes nothing at the receiver refuses a write. SGLang freed pages "
            "on abort before prefill's in-flight writes drained (sglang #24527: \"A's write lands on "
            "B's KV\"); the pages are granted again and the old write lands in the new owner's page."
        ),
        write_path="one_sided",
        release_fence="none",
    ),
    _R.derive(
        "m8_release_on_timeout",
        "A deferred release resolves on a timeout without the drain ack.",
        m_numbers=("M8",),
        breaks=("no_late_write_lands_in_reallocated_page",),
        explanation=(
            "SGLang defers release until prefill acks the drain, *or* a deadline passes. A timeout "
            "cannot prove a one-sided write stopped (Mooncake has no cancel), so the deadline path "
            "is itself a use-after-free window (PR #38961)."
        ),
        write_path="one_sided",
        release_fence="ack_or_timeout",
    ),
    _R.derive(
        "m10_stale_status_adopted",
        "A late or duplicated completion is adopted by a new request reusing the room.",
        m_numbers=("M10", "M20"),
        breaks=("no_cross_tenant_read",),
        explanation=(
            "Matching status by room alone lets a duplicate of an old request's completion be "
            "adopted by a new request that reuses the room (client-chosen rooms, n>1 fan-outs; "
            "sglang #40125). Even a digest does not save it when the digest is not bound to the "
            "generation and the pages still hold the old request's data (M20): the digests match. "
            "SGLang's decode checks the room alone (the aux row's `bootstrap_room`), so the "
            "completion is not bound to the request either (binds_request=False)."
        ),
        check_generation=False,
        scrub=False,
        binds_request=False,
    ),
    _R.derive(
        "m15_silent_prefill_abort",
        "A prefill-side abort is not told to decode, which holds its pages until a timeout.",
        m_numbers=("M15",),
        breaks=("every_request_terminates",),
        explanation=(
            "Under SGLang's early policy a prefill-local abort marks the room Failed locally only; "
            "decode learns through its 300 s waiting timeout (PR #28651 measured 1/15 throughput). "
            "Once faults stop, nothing in the protocol ends the request."
        ),
        prefill_abort_notifies_decode=False,
    ),
    _R.derive(
        "m16_router_ignores_prefill_error",
        "The router returns decode's answer and ignores prefill's error.",
        m_numbers=("M16", "M1", "M3"),
        breaks=("rejected_request_gets_error_not_output",),
        explanation=(
            "mini_lb reads only decode's response. Even when prefill reports the abort of a "
            "placeholder-rejected request (M1) as an error, the client receives decode's output, "
            "generated by a decode that trusts the completion (M3)."
        ),
        oversize="placeholder",
        placeholder_reports_error=True,
        validation="none",
        router_honours_prefill_error=False,
    ),
    _R.derive(
        "m18_orphan_grant_accepted",
        "Prefill creates transfer state for a grant whose request it does not hold.",
        m_numbers=("M18",),
        breaks=("every_request_terminates",),
        explanation=(
            "SGLang's bootstrap thread stores `transfer_infos[room]` unconditionally (sglang "
            "#39428): a duplicated or late grant for a finished or forgotten request creates "
            "transfer state that nothing ever clears."
        ),
        prefill_adopts_unknown_grant=True,
    ),
    _R.derive(
        "m20_unscrubbed_pages",
        "Freed pages keep their data.",
        m_numbers=("M20",),
        breaks=("freed_pages_hold_no_readable_data",),
        explanation=(
            "Neither SGLang nor vLLM zeroes attention KV on free. Alone it is harmless against the "
            "reference checks, but it turns any coverage bug into a cross-tenant disclosure."
        ),
        scrub=False,
    ),
    _R.derive(
        "generation_reset_on_restart",
        "Decode's generation counter restarts at 1 after a crash.",
        breaks=("no_late_write_lands_in_reallocated_page",),
        explanation=(
            "Generations are what fence old writes. If the counter is volatile, a write issued "
            "before a decode crash carries a (room, generation) that a new request on the same room "
            "is granted again, and the receiver check lets it in. Only where the write does not "
            "name its request as well (binds_request=False): a write bound to the old request is "
            "refused by the new one's pages."
        ),
        generations_persist=False,
        binds_request=False,
    ),
    _R.derive(
        "room_keyed_matching",
        "Prefill matches grants and aborts by room; decode takes writes and completions by room.",
        breaks=(
            "decode_reads_only_validated_pages",
            "no_cross_tenant_read",
            "accepted_completion_implies_full_coverage",
            "no_late_write_lands_in_reallocated_page",
            "every_request_terminates",
        ),
        explanation=(
            "SGLang keys transfer state by `bootstrap_room`, which the router picks per request and "
            "a client request can carry, so two requests can share a room (n>1 fan-outs: sglang "
            "#26486, #30723, #40297; room collisions: ray #62953). A cancelled request still "
            "waiting at prefill takes the grant decode issued for the next request on its room, "
            "writes its own data into that request's pages, and its completion and digest "
            "validate: they name the pages' writer and the grant's generation, not decode's "
            "request. Decode then generates for the next tenant from the cancelled one's data."
        ),
        matching="room",
        binds_request=False,
    ),
    _R.derive(
        "room_keyed_with_binding",
        "Room-keyed matching, with writes and completions bound to decode's request.",
        breaks=("every_request_terminates",),
        explanation=(
            "The reference's binding on its own: prefill still matches by room, but decode takes a "
            "write or a completion only if it names the request decode holds the pages for. Every "
            "safety property holds (a mismatched transfer is refused and the request fails "
            "closed); what breaks is liveness: the request whose grant another one took waits for "
            "a transfer that never comes. The reference also matches the grant by request id."
        ),
        matching="room",
    ),
    _R.derive(
        "m13_lease_expiry_pull",
        "Pull: prefill's lease expires, its blocks are reused, decode reads them anyway.",
        m_numbers=("M13", "M3"),
        breaks=("no_cross_tenant_read",),
        explanation=(
            "vLLM pins prefill's blocks for a lease (`kv_lease_duration`); on expiry "
            "`_reap_expired_send_leases` frees them and the only trace is a log line on prefill "
            '(vLLM #21570, #52234: "previous prompt\'s answer returned for the new prompt"). '
            "Blocks freed on prefill are reused by its other traffic, so a read that lands after "
            "the expiry delivers another tenant's KV, and a decode without a digest check (M3; "
            "the NIXL path has none) generates from it."
        ),
        transfer="pull",
        lease_expiry_notifies_decode=False,
        validation="none",
    ),
    _R.derive(
        "m14_silent_receive_failure_pull",
        "Pull: a failed read is not reported; decode runs on pages that never arrived.",
        m_numbers=("M14", "M3"),
        breaks=("decode_reads_only_validated_pages",),
        explanation=(
            "vLLM's HMA path left failed receives unreported (`# TODO handle failed transfer for "
            'HMA`; #52234, fixed by PR #52232 "Fail closed on HMA receive errors"): the request '
            "finished receiving with HTTP 200 and decode ran on whatever its blocks held."
        ),
        transfer="pull",
        transfer_failure_reported=False,
        validation="none",
    ),
    _R.derive(
        "first_rank_completion_accepted",
        "Decode accepts the transfer when the first prefill rank reports success.",
        breaks=("accepted_completion_implies_full_coverage", "decode_reads_only_validated_pages"),
        explanation=(
            "No M-number: engines.md section 7 lists no rank-quorum bug; this is the guard SGLang "
            "has (`apply_prefill_status` declares Success only when `len(prefill_response_tracker"
            "[room]) >= required_prefill_response_num`) done wrong, analogous to M3 (one signal "
            "taken as proof of coverage) and M2 (a completion count from the wrong view): the "
            "required count computed as 1, e.g. from decode's own topology. Each rank writes "
            "only its own shard of every page, so the first rank's valid completion proves that "
            "shard alone; decode accepts while the other rank's shards are still in flight and "
            "generates from pages that are partly zeroed. Only observable with several prefill "
            "ranks: with one (`--set prefill_ranks=1`) the first rank is every rank and the "
            "variant is the reference protocol, safe. Its catalogue entry is checked with two "
            "ranks and no faults: the bug needs none, and a decode that releases pages while a "
            "rank still writes multiplies the states the faults would add."
        ),
        completion_quorum="first_rank",
        config={"prefill_ranks": 2, "max_faults": 0},
    ),
    _R.derive(
        "retry_reuses_request_id",
        "A retried request's first-attempt grant or abort is taken by its second attempt.",
        breaks=("every_request_terminates",),
        explanation=(
            "No M-number: engines.md section 7 lists no retry bug; the mechanism is M10's (a late "
            "message of a finished incarnation adopted by a new one under the same key) and "
            "M18's (transfer state keyed by an id the worker no longer serves), with the key a "
            "request id a client resubmits rather than a shared room. Prefill matches grants and "
            "aborts by request id, and stops a request still waiting for its grant on an abort of "
            "any generation, since decode may abort a grant prefill has not received; a retry "
            "under the same id cannot be told from its first attempt. The first attempt's abort, "
            "still in flight when the client retries (the client got its error at once), stops "
            "the second attempt at prefill, and decode waits for ever on the grant it made for "
            "it; a stale grant taken instead makes prefill write under a generation decode no "
            "longer holds (refused: the generation and request binding keep it safe) and decode "
            "waits the same. The reference carries the router's attempt number on every message "
            "(`attempt_fence`). Checked with one retry over the sequential scenario (one fault): the "
            "client's cancel is what gives it the error and leaves decode's abort in flight; "
            "without a fault the only error is prefill's rejection of the over-long request, "
            "which its retry gets again, stale grant or not."
        ),
        attempt_fence=False,
        config={"max_retries": 1},
        # On `wide` the explorer needs about 500 s for it (docs/matrix.md); on `sequential`, 90 s.
        scenario_name="sequential",
    ),
    _R.derive(
        "release_on_suspected_death",
        "One-sided, drain-fenced: decode releases without the ack when it takes prefill for dead.",
        breaks=("no_late_write_lands_in_reallocated_page", "freed_pages_hold_no_readable_data"),
        explanation=(
            "No M-number: engines.md section 7 lists no partition bug; it is M8's window opened "
            "by a health check instead of a deadline. On the one-sided, drain-fenced design "
            "(`one_sided_fenced`) decode's heartbeat to prefill misses in a network partition "
            "(SGLang: `HEARTBEAT_MAX_FAILURE` misses -> `_handle_node_failure`), and decode "
            "fails the requests it waits on and frees their pages without the drain ack, "
            "reasoning that a dead writer's writes cannot land (the comment on our "
            "implementation's `_fail_after_prefill_loss`; SGLang's deferred release after "
            "heartbeat loss resolves on its 30 s timeout). But prefill is alive: it still holds "
            "the grant and writes until the abort reaches it, and nothing at the receiver "
            "refuses a one-sided write, so the write lands in a page granted again to the next "
            "request (in the sequential scenario, given 23 steps, after the next tenant's "
            "completion validated: decode generates from it, a cross-tenant read). The "
            "reference survives the same partition (decode's ownership check refuses the late "
            "write), and so does `one_sided_fenced` (the pages wait for the ack). Checked with "
            "one partition allowed (`max_partitions=1`): the bug needs it."
        ),
        write_path="one_sided",
        release_fence="drain_ack",
        fence_survives_suspicion=False,
        config={"max_partitions": 1},
    ),
    _R.derive(
        "release_on_prefill_failure",
        "One-sided, drain-fenced: decode releases at once on prefill's failure notice.",
        breaks=("no_late_write_lands_in_reallocated_page", "freed_pages_hold_no_readable_data"),
        explanation=(
            "No M-number: the window behind SGLang's deferred release after a Failed status "
            "(engines.md 2.7: an RDMA or session failure, Failed and m7 to decode, release "
            "deferred until the ack). Decode fences its own aborts but takes prefill's failure "
            "notice as proof that prefill stopped writing, and frees the pages at once. A write "
            "that fails on prefill's side does not recall the others of the grant, and nothing "
            "at the receiver refuses a one-sided write: one lands in a page decode has freed "
            "(10 steps), which then holds the tenant's data for whoever is granted it next. `one_sided_fenced` sends the abort and waits for the "
            "ack (`fence_on_prefill_failure`); the reference refuses the late write. Checked "
            "with one failed write allowed (`max_write_errors=1`): the bug needs it."
        ),
        write_path="one_sided",
        release_fence="drain_ack",
        fence_on_prefill_failure=False,
        config={"max_write_errors": 1},
    ),
    _R.derive(
        "reference_pull",
        "Alternative design: the reference protocol on the pull path (decode reads).",
        explanation=(
            "Lease expiries and failed reads are told to decode, and decode's digest check covers "
            "what actually landed. Expected safe."
        ),
        transfer="pull",
    ),
    _R.derive(
        "reference_pull_recompute",
        "Alternative design: the pull path where decode recomputes after a failed read.",
        explanation=(
            'vLLM\'s `kv_load_failure_policy="recompute"`: a failed read does not fail the '
            "request; decode prefills the prompt itself into the pages it holds and generates. "
            "It recomputes under a fresh generation, so a read of the failed transfer that is "
            "still in flight is refused when it lands. Expected safe."
        ),
        transfer="pull",
        load_failure="recompute",
    ),
    _R.derive(
        "recompute_without_fence",
        "Pull, recompute policy: a read of the failed transfer lands on a recomputed page.",
        breaks=("no_cross_tenant_read", "decode_reads_only_validated_pages"),
        explanation=(
            "No M-number: a hazard of the recompute policy (vLLM's `kv_load_failure_policy="
            '"recompute"`, its default until PR #34896). One read of a transfer fails and '
            "decode recomputes the pages under the grant it holds, while another read of the "
            "same transfer is still in flight: a failed read does not stop the others (vLLM "
            'retains the NIXL handles it cannot release: "A status error does not guarantee '
            "that the backend stopped DMA\"). That read lands after prefill's lease expired, "
            "with the reused block's data (another tenant's, as in M13), on a page decode has "
            "already recomputed and will not check again: it generates from it. Two faults: "
            "the failed read and the lease expiry."
        ),
        # The two faults the hazard needs, and no other kind: on the sequential scenario every
        # kind with two faults is about four million states.
        config={
            "max_faults": 2,
            "max_crashes": 0,
            "max_cancels": 0,
            "max_prefill_aborts": 0,
            "max_duplicates": 0,
        },
        transfer="pull",
        load_failure="recompute",
        recompute_fence=False,
    ),
    _R.derive(
        "one_sided_fenced",
        "Alternative design: one-sided writes, release only after prefill's drain ack.",
        explanation=(
            "What SGLang's deferred release does without its timeout path: with one-sided writes "
            "decode cannot refuse a late write, so it holds the pages of an aborted request until "
            "prefill acknowledges that no write of that generation is in flight. Expected safe."
        ),
        write_path="one_sided",
        release_fence="drain_ack",
    ),
)

_BY_NAME = {v.name: v for v in VARIANTS}


class UnknownVariantError(KeyError):
    """No catalogue variant has this name (a `KeyError`, as a dictionary lookup would raise)."""


def get_variant(name: str) -> Variant:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownVariantError(
            f"unknown variant {name!r}{_did_you_mean(name, _BY_NAME)}; known variants: {', '.join(sorted(_BY_NAME))} "
            "(or a path to a .py file defining VARIANT)"
        ) from None
