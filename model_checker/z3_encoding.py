"""The spec's state machine as Z3 formulas, for one fixed configuration.

This is the encoding behind the `bmc`, `kind` and `spacer` engines. DESIGN.md §2 rule 2: Z3 takes
its meaning from `spec/`, and nothing here states the protocol: every action's guard and effect is the spec's
formula (`spec.machine.rule_guard` and `rule_effect`, or a variant's formula guard and effect),
translated by `model_checker.logic_z3` over the variables below (`rule`). This module only lays
out the variables, lists the action *instances* (an action and its arguments) and builds the
transition relation from the translated guards and effects; a test compares that relation with
every edge of the explicit explorer's graph (`model_checker.z3_crosscheck`). The hand-written
encoders of each action that the first versions had were retired once the differential tests had
shown them equal to the translated formulas on every well-formed state (docs/one-semantics.md).

State (one copy per time step, named `r{i}.field`, `pg{j}.field` and plain global names):

* per request: the router/prefill/decode fields of `ReqState` (phases as small Ints, page tuples as
  one Bool per page: every page tuple in the spec is ascending, so a set determines it), the answer
  (`ans_set`, `ans_ok`, `ans_reason` as an index into `REASONS`), and the ghost `read` and
  `accepted_full`;
* per request, one *slot* per message kind (`g` grant, `c` completion, `f` failure, `a` abort,
  `k` abort ack): the message's fields plus its multiplicity in the network (`net`) and among the
  lost messages (`lost`). A request sends at most one distinct message of each kind, so a slot is a
  faithful multiset (the decoder checks it);
* per request and page, a write in flight (`w{j}`): its room, generation, data and epoch are the
  request's own prefill fields, which no longer change once prefill holds a grant;
* per page: owner, content tag and last tenant; globals: generation counter, epochs, faults, ghost.

Integers are Z3 Ints (no wrap-around); their ranges are invariants, not assumptions.

The transition relation, in the pysmt `examples/model_checking.py` style::

    T(s, a, s') =  0 <= a < N
                 /\\ AND_i (a = i  ->  guard_i(s))
                 /\\ AND_v  v' = ite(a = i1, e_{i1,v}(s), ite(a = i2, ..., v))

where `i` ranges over action *instances* (an action and its arguments: a request, a page, a
message slot), and only the instances that change `v` appear in its ite chain (frame: `v' = v`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import z3

from kvhandoff.model_checker.z3_bounds import step_bounds
from kvhandoff.spec.actions import (
    Action,
    ClientCancelRequest,
    DecodeAdmitRequest,
    DecodeAnswer,
    DecodeDetectPrefillRestart,
    DecodeGenerate,
    DecodeReceiveAbortAck,
    DecodeReceiveCancel,
    DecodeReceiveCompletion,
    DecodeReceiveFailure,
    DecodeReceiveWrite,
    DecodeRejectRequest,
    DecodeReleasePages,
    DecodeReleaseTimeout,
    DecodeReservePages,
    DecodeRestart,
    DecodeSuspectPrefillDead,
    DecodeWaitingTimeout,
    NetworkDropMessage,
    NetworkDuplicateMessage,
    NetworkFailTransfer,
    PrefillAbortRequest,
    PrefillAdmitRequest,
    PrefillDetectDecodeRestart,
    PrefillLeaseExpire,
    PrefillReceiveAbort,
    PrefillReceiveCancel,
    PrefillReceiveGrant,
    PrefillRejectRequest,
    PrefillRestart,
    PrefillSendAbortAck,
    PrefillSendCompletion,
    PrefillWriteError,
    PrefillWritePage,
    RetransmitMessage,
    RouterRetryRequest,
    RouterSubmitRequest,
    snake_case,
)
from kvhandoff.spec.config import Config
from kvhandoff.spec.effects import EffectFormula
from kvhandoff.spec.logic import GuardFormula
from kvhandoff.spec.machine import RULE_EFFECTS, RULE_GUARDS, rule_effect, rule_guard
from kvhandoff.spec.state import (
    OTHER_TENANT,
    Answer,
    Faults,
    Ghost,
    Message,
    PageState,
    ReqState,
    State,
    Tag,
    Write,
)
from kvhandoff.spec.variants import Variant


def epoch_var(name: str, *instances: int) -> str:
    """The variable of an instance's boot epoch (`prefill_epoch`, `decode_epoch`) or of one
    worker's view of a peer's (`dsp`: decode instance j's of prefill i; `psd`: prefill i's of
    decode j). Instance 0's (pair (0, 0)'s) keeps the one-instance name; the instances are
    constants of the encoding, like a generation counter's (`logic_z3.FixedReading.apply`
    splits a symbolic one into cases before asking)."""
    if not any(instances):
        return name
    return name + "_".join(str(i) for i in instances)


class EncodingError(AssertionError):
    """The Z3 encoding disagrees with the spec: a bug in this module, never a verdict."""


class CannotEncode(Exception):
    """The variant has extra actions or step overrides this encoder cannot translate."""


P_PHASES = ("none", "received", "admitted", "rejected", "granted", "completed", "aborted", "lost")
D_PHASES = (
    "none",
    "received",
    "admitted",
    "rejected",
    "reserved",
    "validated",
    "generated",
    "answered",
    "failed",
    "released",
    "lost",
)
P = {name: i for i, name in enumerate(P_PHASES)}
D = {name: i for i, name in enumerate(D_PHASES)}
REASONS = (
    "",
    "prompt over the context window",
    "rejected by prefill: prompt over its limit",
    "aborted by prefill: prompt over its limit",
    "rejected by decode: prompt over its limit",
    "completion failed validation",
    "prefill reported failure: rejected",
    "prefill reported failure: aborted",
    "prefill restarted",
    "cancelled by the client",
    "timed out waiting for prefill",
    "aborted by prefill",
    "decode restarted",
    "prefill reported failure: lease expired",
    "page transfer failed",
    "prefill stopped answering health checks",
)
REASON = {text: i for i, text in enumerate(REASONS)}
KINDS = ("grant", "completion", "failure", "abort", "abort_ack")
SLOT = {
    "grant": "g",
    "completion": "c",
    "failure": "f",
    "abort": "a",
    "abort_ack": "k",
    "lease_failure": "e",
}
RANKED = ("completion", "abort_ack")
"""The messages each prefill rank sends of its own: with several ranks, one slot per rank."""
RANK_SETS = ("prd", "drk", "dak", "pak")
"""With several ranks, per request and rank: `p_rank_done`, `d_rank`, `d_ack`, `p_acked`."""


def slot(kind: str) -> str:
    """The variable prefix of a message slot: `SLOT[kind]`, and for rank k's completion or abort
    ack (`completion.k`, k >= 1) the kind's prefix followed by k (`c1`)."""
    base, _, rank = kind.partition(".")
    return SLOT[base] + rank


def slot_kind(kind: str, rank: int) -> str:
    """The slot of a message of `kind` sent by `rank` (rank 0 keeps the one-rank names)."""
    return f"{kind}.{rank}" if rank and kind in RANKED else kind


def slot_rank(kind: str) -> int:
    """The rank whose message a slot holds (0 for the slots of unranked messages)."""
    return int(kind.partition(".")[2] or 0)


def shard(j: int, k: int) -> str:
    """The variable prefix of rank k's shard of page j (rank 0: the page's one-rank names)."""
    return f"pg{j}." if k == 0 else f"pg{j}.s{k}."


def read_shard(r: int, j: int, k: int) -> str:
    """The prefix of what decode read for request r from rank k's shard of page j."""
    return f"r{r}.rc{j}" if k == 0 else f"r{r}.rc{j}s{k}"


def att(r: int, a: int = 0) -> str:
    """The variable prefix of request r's attempt a (`r{r}.`; a retry's attempt a >= 1:
    `r{r}.a{a}`): the prefix of the message slots and writes that attempt sent."""
    return f"r{r}." if a == 0 else f"r{r}.a{a}"


def write_var(r: int, j: int, k: int, a: int = 0) -> str:
    """Request r's write of rank k's shard of page j, issued by attempt a, in flight."""
    return f"{att(r, a)}w{j}" if k == 0 else f"{att(r, a)}w{j}s{k}"


def slot_args(args: tuple[Any, ...]) -> tuple[str, int, int]:
    """(kind, request, attempt) of a message instance's arguments, `(kind, r)` or, for a retry's
    attempt a >= 1, `(kind, r, a)`."""
    return (args[0], args[1], args[2] if len(args) > 2 else 0)


def write_args(args: tuple[Any, ...]) -> tuple[int, int, int, int]:
    """(request, page, rank, attempt) of a write instance's arguments: `(r, j)`, with ranks
    `(r, j, k)`, and for a retry's attempt a >= 1 `(r, j, k, a)`."""
    return (
        args[0],
        args[1],
        args[2] if len(args) > 2 else 0,
        args[3] if len(args) > 3 else 0,
    )


LEASE_EXPIRED = "lease expired"
"""Pull path: a request can send two distinct failure messages (an abort's, and its lease's expiry
notice), so the expiry notice has a slot of its own, `lease_failure` (a `failure` message with
this reason)."""
FAULT_FIELDS = (
    "crashes",
    "drops",
    "duplicates",
    "timeouts",
    "cancels",
    "prefill_aborts",
    "partitions",
    "write_errors",
)
GHOST_FIELDS = (
    "late_landing",
    "refused_write",
    "drain_acked",
    "cross_tenant_reuse",
    "page_reuse",
    "scrubbed_written_page",
    "cancelled_mid_transfer",
    "ok_after_crash",
    "ok_after_loss",
)

SymState = dict[str, Any]
"""One time step's variables (or concrete values, for evaluation), by name."""


def _sum_bools(bools: Sequence[Any], zero: Any, one: Any) -> Any:
    if not bools:
        return zero
    return z3.Sum([z3.If(b, one, zero) for b in bools])


@dataclass(frozen=True)
class Instance:
    """An action with its arguments: `args` is `(r,)`, `(r, page)`, `(kind, r)` or `()`."""

    name: str
    args: tuple[Any, ...]
    fault: bool


def _rename(formulas: Sequence[Any], sources: Sequence[Any], targets: Sequence[Any]) -> list[Any]:
    """`z3.substitute(f, *zip(sources, targets))` for each f, through Z3's C API: the Python
    API's per-pair checks cost several times the substitution itself (the sorts agree by
    construction here)."""
    n = len(sources)
    old = (z3.Ast * n)(*[x.as_ast() for x in sources])
    new = (z3.Ast * n)(*[x.as_ast() for x in targets])
    out = []
    for f in formulas:
        ctx = f.ctx
        out.append(type(f)(z3.Z3_substitute(ctx.ref(), f.as_ast(), n, old, new), ctx))
    return out


class Encoding:
    """The Z3 encoding of `variant` on `config`. See the module docstring for the layout."""

    def __init__(
        self,
        variant: Variant,
        config: Config,
        width: int | None = 5,
    ) -> None:
        # Client retries. A retried request's first attempt leaves messages and writes in
        # flight (a duplicated grant, an abort, a late write) that meet its second attempt's:
        # two distinct messages of one request and kind, and writes of a generation the
        # request's prefill no longer holds. Everything else the spec keeps per request is reset
        # by the retry (or, like the drain ack owed, kept once per request by the spec itself),
        # so only what is *in flight* needs room for several attempts: each attempt gets its own
        # message slots and write slots (`att(r, a)`), and a message carries its slot's attempt.
        # Attempt 0 keeps the names of an encoding without retries, so with `max_retries` 0 the
        # layout, the instances and the relation are exactly those of before. A write's fields
        # cannot be read off prefill's fields once a retry has reset them, so with retries each
        # attempt's writes keep their grant's generation and epoch (`wgen`, `wepoch`), recorded
        # when issued (prefill's grant does not change while its writes are in flight).
        self.attempts = config.max_retries + 1
        self.retries = config.max_retries > 0
        # Several decode instances: a generation counter each (`next_gen`, `next_gen1`, ...);
        # where a request is placed is the scenario's, so every instance a step names is a
        # constant of the encoding (`logic_z3.FixedReading`).
        self.decode_instances = config.decode_instances
        self.prefill_instances = config.prefill_instances
        if self.retries and config.prefill_ranks > 1:
            raise CannotEncode(
                f"max_retries={config.max_retries} with {config.prefill_ranks} prefill ranks: "
                "the fixed encoding holds retries with one rank only; check it with the "
                "explicit engine"
            )
        if not variant.is_pure_design:
            raise CannotEncode(
                f"variant {variant.name!r} has Python code the Z3 encoding cannot translate: "
                f"{', '.join(variant.untranslated())}"
            )
        self.variant = variant
        self.design = variant.design
        self.formula_guards = variant.formula_guards()
        self.guard_formulas: dict[str, GuardFormula] = {
            name: rule_guard(variant.design, name) for name in RULE_GUARDS
        }
        """The guard each action's instances take, as a formula: the rulebook's (written once in
        `spec/machine.py`), or a variant's formula guard where it replaces it."""
        self.guard_formulas.update({n: h.formula for n, h in self.formula_guards.items()})
        self.effect_formulas: dict[str, EffectFormula] = {
            name: rule_effect(variant.design, name) for name in RULE_EFFECTS
        }
        """The effect each action's instances take, as a formula: the rulebook's, or a
        variant's formula effect where it replaces it."""
        self.effect_formulas.update({n: h.formula for n, h in variant.formula_effects().items()})
        self.added_kinds: dict[str, type] = {
            snake_case(t.__name__): t for t in variant.extra_action_types
        }
        """The actions the variant adds, each with a formula guard and a formula effect (else
        `is_pure_design` refused it above): instances after the protocol's own steps."""
        self.reasons: list[str] = list(REASONS)
        """The answers' reasons, by code: `REASONS`, then those a variant's effects add."""
        self.state_fields: dict[str, Any] = dict(variant.state_fields)
        """The variant's own state fields: one variable each, `v.NAME` (a bool or an int)."""
        self.pull = variant.design.transfer == "pull"
        self.ranks = config.prefill_ranks
        """Prefill ranks: each writes its own shard of every page and sends its own completion
        and drain ack, so with several a page has one shard per rank and a request one
        completion slot and one abort-ack slot per rank (`completion.1`, ...)."""
        self.slot_kinds = (
            KINDS
            + (("lease_failure",) if self.pull else ())
            + tuple(f"{kind}.{k}" for kind in RANKED for k in range(1, self.ranks))
        )
        """Message slots per request: `KINDS`, on the pull path the lease expiry notice, and with
        several ranks a completion and an abort-ack slot of each further rank."""
        self.config = config
        self.n = len(config.requests)
        self.np = config.decode_pages
        self.rooms = [r.room for r in config.requests]
        self.lens = [r.pages for r in config.requests]
        tenants = config.tenants
        self.tenant_names = tenants
        self.tid = [tenants.index(r.tenant) for r in config.requests]
        self.width = width
        """Bit-vector width of every integer (None: unbounded Ints). Values must stay in
        [0, 2**(width-1)) (`in_range`): BMC proves they do within its bound, or widens."""
        self.fields = self._declare()
        self._tag_requests = {
            name for name, _ in self.fields if self.pull and name.endswith(("c_req", "_req"))
        } - {f"pg{j}.own_req" for j in range(self.np)}
        self._template: Any = None
        self._states: dict[tuple[int, str], SymState] = {}
        self._template_vars: list[Any] = []
        self._tpl_rules: list[tuple[Any, dict[str, Any]]] | None = None
        self._packed: dict[tuple[Any, str], Any] = {}
        self._tpl_properties: dict[str, Any] | None = None
        self._narrowed: dict[str, list[dict[str, tuple[int, int]]]] = {}
        self.instances = self._instances()
        for name in sorted({i.name for i in self.instances}):
            # Every action of the rulebook has both formulas, under every design, and a variant's
            # added action has both or `is_pure_design` refused it: a gap is said, not guessed.
            missing = [
                part
                for part, table in (
                    ("guard", self.guard_formulas),
                    ("effect", self.effect_formulas),
                )
                if name not in table
            ]
            if missing:
                raise CannotEncode(
                    f"action {name!r} has no {' and no '.join(missing)} formula to translate"
                )

    # --- variables ------------------------------------------------------------------------------

    def _declare(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        pages = range(self.np)
        for r in range(self.n):
            for f in ("submitted", "ans_set", "ans_ok"):
                out.append((f"r{r}.{f}", "B"))
            out.append((f"r{r}.ans_reason", "I"))
            for f in ("p", "p_len", "p_gen", "p_wrote", "p_epoch", "p_gdinst"):
                out.append((f"r{r}.{f}", "I"))
            out += [(f"r{r}.p_pages{j}", "B") for j in pages]
            for f in ("d", "d_gen", "d_epoch"):
                out.append((f"r{r}.{f}", "I"))
            out += [(f"r{r}.d_pages{j}", "B") for j in pages]
            for f in ("d_awaiting", "d_cancel", "p_cancel", "not_as_is"):
                out.append((f"r{r}.{f}", "B"))
            for f in ("read_set", "acc_set", "acc_full"):
                out.append((f"r{r}.{f}", "B"))
            out += [(f"r{r}.read_pages{j}", "B") for j in pages]
            for j in pages:
                for k in range(self.ranks):
                    rc = read_shard(r, j, k)
                    out += [(f"{rc}_has", "B"), (f"{rc}_req", "I"), (f"{rc}_gen", "I")]
            for kind in self.slot_kinds:
                sk = slot(kind)
                out += [(f"r{r}.{sk}_net", "I"), (f"r{r}.{sk}_lost", "I"), (f"r{r}.{sk}_gen", "I")]
            out += [(f"r{r}.g_pages{j}", "B") for j in pages]
            out.append((f"r{r}.g_epoch", "I"))
            for kind in self.slot_kinds:
                if kind.split(".")[0] == "completion":
                    c = slot(kind)
                    out += [(f"r{r}.{c}_count", "I"), (f"r{r}.{c}_digest", "B")]
                    out += [(f"r{r}.{c}_dpages{j}", "B") for j in pages]
            out.append((f"r{r}.f_aborted", "B"))
            out += [(write_var(r, j, k), "B") for j in pages for k in range(self.ranks)]
            out += [(f"r{r}.pa", "B"), (f"r{r}.pa_gen", "I")]
            if self.ranks > 1:
                # The rank sets: completions prefill sent, completions decode accepted, drain
                # acks decode received, drain acks prefill sent (one rank keeps none of them).
                for name in RANK_SETS:
                    out += [(f"r{r}.{name}{k}", "B") for k in range(self.ranks)]
            out += [(f"r{r}.orph", "B"), (f"r{r}.orph_gen", "I")]
            if self.pull:
                out.append((f"r{r}.lease_expired", "B"))
            if self.retries:
                out.append((f"r{r}.attempt", "I"))
                for a in range(self.attempts):
                    out += self._attempt_slots(r, a) if a else []
                    out += [(f"{att(r, a)}wgen", "I"), (f"{att(r, a)}wepoch", "I")]
        for j in pages:
            out += [(f"pg{j}.own", "B"), (f"pg{j}.own_req", "I"), (f"pg{j}.own_gen", "I")]
            for k in range(self.ranks):
                sh = shard(j, k)
                out += [(f"{sh}has", "B"), (f"{sh}c_req", "I"), (f"{sh}c_gen", "I")]
            out += [(f"pg{j}.lt_set", "B"), (f"pg{j}.lt", "I")]
        out += [
            ("next_gen", "I"),
            *((f"next_gen{i}", "I") for i in range(1, self.decode_instances)),
            *((epoch_var("prefill_epoch", i), "I") for i in range(self.prefill_instances)),
            *((epoch_var("decode_epoch", j), "I") for j in range(self.decode_instances)),
            *((epoch_var("dsp", j, i), "I") for j, i in self._pairs()),
            *((epoch_var("psd", i, j), "I") for j, i in self._pairs()),
        ]
        out += [(f"f.{f}", "I") for f in FAULT_FIELDS]
        if self.retries:
            out.append(("f.retries", "I"))
        out += [(f"gh.{g}", "B") for g in GHOST_FIELDS]
        out += [
            (f"v.{name}", "B" if isinstance(initial, bool) else "I")
            for name, initial in sorted(self.state_fields.items())
        ]
        return out

    def _attempt_slots(self, r: int, a: int) -> list[tuple[str, str]]:
        """The message slots and write slots of request r's attempt a >= 1 (attempt 0's are
        the request's own, declared with it)."""
        out: list[tuple[str, str]] = []
        pre, pages = att(r, a), range(self.np)
        for kind in self.slot_kinds:
            sk = slot(kind)
            out += [(f"{pre}{sk}_net", "I"), (f"{pre}{sk}_lost", "I"), (f"{pre}{sk}_gen", "I")]
        out += [(f"{pre}g_pages{j}", "B") for j in pages]
        out.append((f"{pre}g_epoch", "I"))
        for kind in self.slot_kinds:
            if kind.split(".")[0] == "completion":
                c = slot(kind)
                out += [(f"{pre}{c}_count", "I"), (f"{pre}{c}_digest", "B")]
                out += [(f"{pre}{c}_dpages{j}", "B") for j in pages]
        out.append((f"{pre}f_aborted", "B"))
        out += [(write_var(r, j, k, a), "B") for j in pages for k in range(self.ranks)]
        return out

    def reason_code(self, reason: str) -> int:
        """The code of an answer's reason (a reason only a variant's effect gives gets the next
        code)."""
        if reason not in self.reasons:
            self.reasons.append(reason)
        return self.reasons.index(reason)

    def K(self, x: int) -> Any:
        """An integer constant of the encoding's integer sort."""
        return z3.IntVal(x) if self.width is None else z3.BitVecVal(x, self.width)

    def _count(self, bools: Sequence[Any]) -> Any:
        return _sum_bools(bools, self.K(0), self.K(1))

    def _write_args(self, r: int, j: int, k: int) -> tuple[int, ...]:
        """The arguments of an instance that takes request r's write of page j by rank k:
        `(r, j)` with one rank (its names are the one-rank model's), `(r, j, k)` with several."""
        return (r, j, k) if self.ranks > 1 else (r, j)

    def _rank(self, s: SymState, prefix: str, j: int) -> Any:
        """How many pages below page j are in the set `prefix{*}`: page j's position in the
        spec's ascending page tuple (the order prefill writes its grant in)."""
        return self._count([s[f"{prefix}{q}"] for q in range(j)])

    def _int(self, name: str) -> Any:
        return z3.Int(name) if self.width is None else z3.BitVec(name, self.width)

    def state_at(self, t: int, prefix: str = "") -> SymState:
        """`at_time`: the variables of step `t`."""
        key = (t, prefix)
        if key not in self._states:
            self._states[key] = self._new_state(t, prefix)
        return self._states[key]

    def narrow(self, depth: int, prefix: str = "") -> bool:
        """Give the states `prefix` 0 .. depth fewer SAT variables, and the solver what no path
        of t steps can reach: where `intervals` bounds a variable at step t, the step's variable
        is a bit-vector of just the bits that interval needs, zero- (sign-, for a negative bound)
        extended to `width` in the state's formulas, or the constant itself when the interval is
        one value (for a Bool too). Formulas are unchanged, at `width` bits: a state reachable in
        t steps has its values in the step-t intervals, so on the paths that BMC unrolls from
        `init` the narrow variable holds exactly the full-width value, and an update whose value
        would not fit only rules out states that are not reachable within t steps. False
        (nothing narrowed) when the intervals are not shown."""
        assert self.width is not None and not any(p == prefix for _, p in self._states)
        steps = self.intervals(depth)
        if steps is None:
            return False
        self._narrowed[prefix] = steps
        return True

    def _narrow_state(self, t: int, prefix: str) -> SymState:
        assert self.width is not None
        steps = self._narrowed[prefix]
        if t >= len(steps):
            raise EncodingError(f"step {t} is beyond the {len(steps) - 1} steps narrowed")
        out: SymState = {}
        for name, kind in self.fields:
            var = f"{prefix}{name}@{t}"
            lo, hi = steps[t][name]
            if kind == "B":
                out[name] = z3.BoolVal(lo == 1) if lo == hi else z3.Bool(var)
                continue
            if lo == hi:
                out[name] = self.K(lo)
                continue
            signed = lo < 0
            bits = max((-lo - 1).bit_length(), hi.bit_length()) + 1 if signed else hi.bit_length()
            out[name] = z3.BitVec(var, bits)
            if bits < self.width:
                extend = z3.SignExt if signed else z3.ZeroExt
                out[name] = extend(self.width - bits, out[name])
        return out

    def _new_state(self, t: int, prefix: str) -> SymState:
        if prefix in self._narrowed:
            return self._narrow_state(t, prefix)
        return {
            name: z3.Bool(f"{prefix}{name}@{t}")
            if kind == "B"
            else self._int(f"{prefix}{name}@{t}")
            for name, kind in self.fields
        }

    def action_at(self, t: int, prefix: str = "") -> Any:
        """The action instance taken from step t to t+1 (an index into `instances`)."""
        if self.width is None:
            return z3.Int(f"{prefix}act@{t}")
        return z3.BitVec(f"{prefix}act@{t}", self.act_width)

    @property
    def act_width(self) -> int:
        return max(8, len(self.instances).bit_length() + 1)

    def _pairs(self) -> list[tuple[int, int]]:
        """Every (decode instance, prefill instance), in the spec's order (decode's first)."""
        return [(j, i) for j in range(self.decode_instances) for i in range(self.prefill_instances)]

    def minimum(self, name: str) -> int:
        """The least value an integer variable holds: 0, but -1 for the request of a content tag
        on the pull path (`Tag(-1, 0, OTHER_TENANT)`: data from outside the scenario)."""
        return -1 if name in self._tag_requests else 0

    def in_range(self, s: SymState) -> Any:
        """Every integer is at least its `minimum` (and, as a bit-vector, below 2**(width-1)):
        no wrap-around."""
        return z3.And([s[name] >= self.minimum(name) for name, kind in self.fields if kind == "I"])

    # --- init -----------------------------------------------------------------------------------

    def initial(self, name: str) -> int:
        """The initial value of a variable (a Bool as 0 / 1): 0, but the generation counter at
        1 and a variant's state field at the value it declares."""
        if name.startswith("v."):
            return int(self.state_fields[name[2:]])
        return 1 if name.startswith("next_gen") else 0

    def init(self, s: SymState) -> Any:
        """I(s): every Bool false, every Int `initial` (0, but the generation counter at 1)."""
        cs = []
        for name, kind in self.fields:
            if kind == "B":
                cs.append(s[name] if self.initial(name) else z3.Not(s[name]))
            else:
                cs.append(s[name] == self.initial(name))
        return z3.And(cs)

    # --- instances ------------------------------------------------------------------------------

    def _instances(self) -> list[Instance]:
        d = self.design
        n, reqs = self.n, range(self.n)
        out: list[Instance] = []

        def add(name: str, args: tuple[Any, ...] = (), fault: bool = False) -> None:
            out.append(Instance(name, args, fault))
            # A step that takes a message or a write: one instance per attempt's slot.
            for a in range(1, self.attempts):
                if args and isinstance(args[0], str):
                    out.append(Instance(name, (*args, a), fault))
                elif name in ("decode_receive_write", "network_fail_transfer"):
                    out.append(Instance(name, (*args, *(0,) * (3 - len(args)), a), fault))

        for r in reqs:
            add("router_submit_request", (r,))
        for r in reqs:
            add(
                "prefill_admit_request"
                if self.lens[r] <= self.config.prefill_max_prompt
                else "prefill_reject_request",
                (r,),
            )
        for r in reqs:
            add(
                "decode_admit_request"
                if self.lens[r] <= self.config.decode_max_prompt
                else "decode_reject_request",
                (r,),
            )
        for r in reqs:
            add("decode_reserve_pages", (r,))
        for r in reqs:
            add("prefill_receive_grant", ("grant", r))
        for r in reqs:
            add("prefill_write_page", (r,))
        ranks = range(self.ranks)
        for r in reqs:
            for j in range(self.np):
                for k in ranks:
                    add("decode_receive_write", self._write_args(r, j, k))
        for r in reqs:
            for k in ranks:
                add("prefill_send_completion", (r, k) if self.ranks > 1 else (r,))
        for r in reqs:
            for k in ranks:
                add("decode_receive_completion", (slot_kind("completion", k), r))
        for r in reqs:
            add("decode_receive_failure", ("failure", r))
        for r in reqs:
            add("decode_receive_cancel", (r,))
        for r in reqs:
            add("decode_generate", (r,))
        for r in reqs:
            add("decode_answer", (r,))
        for r in reqs:
            add("decode_release_pages", (r,))
        for r in reqs:
            add("prefill_receive_abort", ("abort", r))
        for r in reqs:
            add("prefill_receive_cancel", (r,))
        # Abort acks exist only where release waits for them: elsewhere no pending ack is ever
        # recorded, so these instances (and every abort_ack slot) are never enabled.
        acks = d.drain_fenced
        kinds = KINDS if acks else tuple(k for k in KINDS if k != "abort_ack")
        kinds += tuple(
            slot_kind(kind, k) for kind in RANKED if kind in kinds for k in range(1, self.ranks)
        )
        # Pull path: the lease expiry notice, where prefill sends one (else its slot stays empty).
        if self.pull and d.lease_expiry_notifies_decode:
            kinds += ("lease_failure",)
            for r in reqs:
                add("decode_receive_failure", ("lease_failure", r))
        if acks:
            for r in reqs:
                for k in ranks:
                    add("prefill_send_abort_ack", (r, k) if self.ranks > 1 else (r,))
            for r in reqs:
                for k in ranks:
                    add("decode_receive_abort_ack", (slot_kind("abort_ack", k), r))
        if d.release_fence == "ack_or_timeout":
            for r in reqs:
                add("decode_release_timeout", (r,))
        for j, i in self._pairs():
            add("decode_detect_prefill_restart", (j, i))
        for i in range(self.prefill_instances):
            for j in range(self.decode_instances):
                add("prefill_detect_decode_restart", (i, j))
        for kind in kinds:
            for r in reqs:
                add("retransmit_message", (kind, r))
        # router_retry_request: only with retries (without them its guard,
        # `retries_spent < max_retries`, never holds).
        if self.retries:
            for r in reqs:
                add("router_retry_request", (r,))
        for r in reqs:
            add("client_cancel_request", (r,), True)
        for r in reqs:
            add("decode_waiting_timeout", (r,), True)
        for r in reqs:
            add("prefill_abort_request", (r,), True)
        for r in reqs:
            add("prefill_write_error", (r,), True)
        for i in range(self.prefill_instances):
            add("prefill_restart", (i,), True)
        for j in range(self.decode_instances):
            add("decode_restart", (j,), True)
        for j, i in self._pairs():
            add("decode_suspect_prefill_dead", (j, i), True)
        if self.pull:
            for r in reqs:
                add("prefill_lease_expire", (r,), True)
            for r in reqs:
                for j in range(self.np):
                    for k in ranks:
                        add("network_fail_transfer", self._write_args(r, j, k), True)
        for kind in kinds:
            for r in reqs:
                add("network_drop_message", (kind, r), True)
        for kind in kinds:
            for r in reqs:
                add("network_duplicate_message", (kind, r), True)
        # A variant's added actions (formula guard and effect), where the explorer lists them:
        # after the protocol's own steps, before the faults.
        faults = next(i for i, inst in enumerate(out) if inst.fault)
        added = []
        for name in self.added_kinds:
            guard = self.guard_formulas[name]
            for args in [(r,) for r in reqs] if guard.params else [()]:
                added.append(Instance(name, args, False))
        out[faults:faults] = added
        assert n >= 1
        return out

    # --- the transition relation ----------------------------------------------------------------

    def rule(self, s: SymState, i: int) -> tuple[Any, dict[str, Any]]:
        """Guard and updated variables of instance i on state s: the action's guard and effect
        formulas (`guard_formulas`, `effect_formulas`), translated."""
        inst = self.instances[i]
        return (
            self._translated_guard(self.guard_formulas[inst.name], s, inst),
            self._translated_effect(self.effect_formulas[inst.name], s, inst),
        )

    def _translated_effect(self, effect: EffectFormula, s: SymState, inst: Instance) -> Any:
        from kvhandoff.model_checker.logic_z3 import fixed_effect

        return fixed_effect(self, s, effect, inst.args)

    def _translated_guard(self, formula: GuardFormula, s: SymState, inst: Instance) -> Any:
        from kvhandoff.model_checker.logic_z3 import FixedReading, translate

        reading = FixedReading(self, s)
        if formula.source == "writes":
            # A step that takes a write: the instance's slot (r, j[, k]) holds it while it is in
            # flight.
            r, j, k, a = write_args(inst.args)
            env = {id(formula.params[0]): reading.write_fields(r, j, k, a)}
            return z3.And(s[write_var(r, j, k, a)], translate(formula.formula, reading, env))
        if formula.source:
            # A step that takes a message: the instance's slot holds it, and the step is enabled
            # only while a copy is there (in the network, or among the messages to resend).
            kind, r, a = slot_args(inst.args)
            env = {id(formula.params[0]): reading.slot_fields(kind, r, a)}
            count = s[f"{att(r, a)}{slot(kind)}_{'net' if formula.source == 'network' else 'lost'}"]
            return z3.And(count > 0, translate(formula.formula, reading, env))
        args = inst.args + (0,) * (len(formula.params) - len(inst.args))  # (r,): one rank
        env = {id(p): a for p, a in zip(formula.params, args, strict=True)}
        return translate(formula.formula, reading, env)

    def _rules_on(self, s: SymState) -> list[tuple[Any, dict[str, Any]]]:
        """`rule(s, i)` for every instance; on the template state, computed once."""
        tpl = self.state_at(0, "tpl_")
        if s is tpl:
            if self._tpl_rules is None:
                self._tpl_rules = [self.rule(s, i) for i in range(len(self.instances))]
            return self._tpl_rules
        return [self.rule(s, i) for i in range(len(self.instances))]

    def trans(self, s: SymState, act: Any, s2: SymState) -> Any:
        """T(s, act, s2); see the module docstring."""
        guards = []
        chains: dict[str, list[tuple[int, Any]]] = {}
        for i, (guard, new) in enumerate(self._rules_on(s)):
            guards.append(z3.Implies(act == i, guard))
            for name, value in new.items():
                chains.setdefault(name, []).append((i, value))
        eqs = []
        for name, _kind in self.fields:
            expr = s[name]
            for i, value in reversed(chains.get(name, [])):
                expr = z3.If(act == i, value, expr)
            eqs.append(s2[name] == expr)
        if self.width is None:
            in_range = z3.And(act >= 0, act < len(self.instances))
        else:
            in_range = z3.ULT(act, len(self.instances))
        return z3.And(in_range, *guards, *eqs)

    def trans_at(self, t: int, prefix: str = "") -> Any:
        """T(s_t, a_t, s_{t+1}), by renaming one symbolic copy of T (built once)."""
        if self._template is None:
            s, a, s2 = self.state_at(0, "tpl_"), self.action_at(0, "tpl_"), self.state_at(1, "tpl_")
            self._template = self.trans(s, a, s2)
            self._template_vars = [*s.values(), a, *s2.values()]
        s, a, s2 = self.state_at(t, prefix), self.action_at(t, prefix), self.state_at(t + 1, prefix)
        targets = [*s.values(), a, *s2.values()]
        return _rename([self._template], self._template_vars, targets)[0]

    def at_step(self, formulas: Sequence[Any], t: int, prefix: str = "") -> list[Any]:
        """Formulas over the template state (`state_at(0, "tpl_")`), renamed to step t's."""
        tpl = self.state_at(0, "tpl_")
        return _rename(formulas, list(tpl.values()), list(self.state_at(t, prefix).values()))

    def properties_at(self, t: int, prefix: str = "") -> dict[str, Any]:
        """`properties(state_at(t, prefix))`, by renaming one copy over the template state."""
        if self._tpl_properties is None:
            self._tpl_properties = self.properties(self.state_at(0, "tpl_"))
        renamed = self.at_step(list(self._tpl_properties.values()), t, prefix)
        return dict(zip(self._tpl_properties, renamed, strict=True))

    def ranges_fit(self, depth: int) -> bool:
        """True when `intervals` shows every integer variable in `[minimum, 2**(width-1))` in
        every state reachable within `depth` steps: then the bit-vectors never wrap around and BMC
        needs no solver query for it. False means "not shown" (the solver is then asked)."""
        return self.width is None or self.intervals(depth) is not None

    def intervals(self, depth: int) -> list[dict[str, tuple[int, int]]] | None:
        """For t = 0 .. depth, an interval per variable (a Bool as 0 = False, 1 = True) holding
        its value in every state reachable within t steps, the integers inside
        `[minimum, 2**(width-1))`; None when not shown. See `model_checker.z3_bounds`."""
        return step_bounds(self, depth)

    def path_values(self, model: Any, k: int, prefix: str = "") -> list[dict[str, Any]]:
        """`values` of steps 0..k. With bit-vectors, each step's variables are packed into one
        concatenation and evaluated by a single `model.eval` (one call per step instead of one
        per variable, which dominated decoding; one per step, not one per path, keeps each
        number far below Python's limit on int/str conversion, which `as_long` goes through);
        with Ints, one `values` call per step."""
        if self.width is None:
            return [self.values(model, self.state_at(t, prefix)) for t in range(k + 1)]
        layout = [(name, kind, 1 if kind == "B" else self.width) for name, kind in self.fields]
        total = sum(bits for *_, bits in layout)
        out: list[dict[str, Any]] = []
        for t in range(k + 1):
            packed = model.eval(self._packed_step(t, prefix), True).as_long()
            v: dict[str, Any] = {}
            shift = total
            for name, kind, bits in layout:  # Concat puts its first argument in the high bits
                shift -= bits
                raw = (packed >> shift) & ((1 << bits) - 1)
                if kind == "B":
                    v[name] = bool(raw)
                else:
                    v[name] = raw - (1 << bits) if raw >> (bits - 1) else raw  # signed
            out.append(v)
        return out

    def _packed_step(self, t: int, prefix: str) -> Any:
        """Step t's variables concatenated into one bit-vector (a Bool as one bit), for
        `path_values`: built once over the template state and renamed (building a concatenation
        of a few hundred terms through the Python API is slow); cached."""
        key = (t, prefix)
        if key not in self._packed:
            tpl = ("", "tpl_")
            if tpl not in self._packed:
                one, zero = z3.BitVecVal(1, 1), z3.BitVecVal(0, 1)
                s = self.state_at(0, "tpl_")
                parts = [
                    z3.If(s[name], one, zero) if kind == "B" else s[name]
                    for name, kind in self.fields
                ]
                self._packed[tpl] = z3.Concat(parts) if len(parts) > 1 else parts[0]
            self._packed[key] = self.at_step([self._packed[tpl]], t, prefix)[0]
        return self._packed[key]

    def get_unrolling(self, k: int, prefix: str = "") -> Iterator[Any]:
        """T(s_0, a_0, s_1), ..., T(s_{k-1}, a_{k-1}, s_k)."""
        for t in range(k):
            yield self.trans_at(t, prefix)

    # --- properties -----------------------------------------------------------------------------

    def properties(self, s: SymState) -> dict[str, Any]:
        """The `ALWAYS` properties of spec/properties.py over one state: their formulas
        themselves, read over this encoding (`logic_z3.fixed_properties`)."""
        from kvhandoff.model_checker.logic_z3 import fixed_properties

        return fixed_properties(self, s)

    # --- concrete values: abstraction (spec -> Z3) and concretization (Z3 -> spec) --------------

    def abstract(self, state: State) -> dict[str, Any]:
        """The values of the encoding's variables for a spec state (absent slots read 0/False)."""
        v: dict[str, Any] = {name: (False if kind == "B" else 0) for name, kind in self.fields}
        c = self.config
        for r, q in enumerate(state.requests):
            v[f"r{r}.submitted"] = q.submitted
            if q.answer is not None:
                v[f"r{r}.ans_set"] = True
                v[f"r{r}.ans_ok"] = q.answer.ok
                v[f"r{r}.ans_reason"] = self.reason_code(q.answer.reason)
            v[f"r{r}.p"] = P[q.p]
            v[f"r{r}.p_len"], v[f"r{r}.p_gen"] = q.p_len, q.p_gen
            v[f"r{r}.p_wrote"], v[f"r{r}.p_epoch"] = q.p_wrote, q.p_epoch
            v[f"r{r}.p_gdinst"] = q.p_grant_dinst
            for j in q.p_pages:
                v[f"r{r}.p_pages{j}"] = True
            v[f"r{r}.d"], v[f"r{r}.d_gen"], v[f"r{r}.d_epoch"] = D[q.d], q.d_gen, q.d_epoch
            for j in q.d_pages:
                v[f"r{r}.d_pages{j}"] = True
            v[f"r{r}.d_awaiting"] = q.d_awaiting_ack
            v[f"r{r}.d_cancel"] = q.d_cancel
            v[f"r{r}.p_cancel"] = q.p_cancel
            v[f"r{r}.not_as_is"] = q.not_as_is
            if self.retries:
                v[f"r{r}.attempt"] = q.attempt
            elif q.attempt:
                raise EncodingError(f"request {r}: attempt {q.attempt} without retries")
            if self.pull:
                v[f"r{r}.lease_expired"] = q.p_lease_expired
            elif q.p_lease_expired:
                raise EncodingError(f"request {r}: a lease expired on the push path")
            if q.read is not None:
                v[f"r{r}.read_set"] = True
                # Decode read its pages in page order, every rank's shard of each (`read` holds
                # `ranks` tags per page); once it released them, which pages they were no longer
                # matters (only the sequence of tags does): use the first ones.
                nk = self.ranks
                read_at = q.d_pages if q.d_pages else tuple(range(len(q.read) // nk))
                if len(q.read) != len(read_at) * nk:
                    raise EncodingError(f"request {r}: read {q.read} but pages {q.d_pages}")
                for i, j in enumerate(read_at):
                    v[f"r{r}.read_pages{j}"] = True
                    for rank in range(nk):
                        tag = q.read[i * nk + rank]
                        if tag is not None:
                            rc = read_shard(r, j, rank)
                            v[f"{rc}_has"] = True
                            v[f"{rc}_req"], v[f"{rc}_gen"] = tag.request, tag.generation
            if q.accepted_full is not None:
                v[f"r{r}.acc_set"], v[f"r{r}.acc_full"] = True, q.accepted_full
            sets = {"prd": q.p_ranks_done, "drk": q.d_ranks, "dak": q.d_acks}
            for name, ranks in sets.items():
                for rank in ranks:
                    if self.ranks == 1:
                        raise EncodingError(f"request {r}: rank set {name} {ranks} with one rank")
                    v[f"r{r}.{name}{rank}"] = True
        seen: dict[tuple[str, int, int], Message] = {}
        for where, bag in (("net", state.network), ("lost", state.lost)):
            for m in bag:
                kind: str = m.kind
                if m.kind == "failure" and m.reason == LEASE_EXPIRED:
                    kind = "lease_failure"
                kind = slot_kind(kind, m.rank)
                if kind not in self.slot_kinds or not 0 <= m.attempt < self.attempts:
                    raise EncodingError(f"message {m} has no slot in this encoding")
                key = (kind, m.request, m.attempt)
                if key in seen and seen[key] != m:
                    raise EncodingError(f"two distinct {kind} messages of request {m.request}")
                seen[key] = m
                k, pre = slot(kind), att(m.request, m.attempt)
                v[f"{pre}{k}_{where}"] += 1
                v[f"{pre}{k}_gen"] = m.generation
                if m.kind == "grant":
                    v[f"{pre}g_epoch"] = m.epoch
                    for j in m.pages:
                        v[f"{pre}g_pages{j}"] = True
                if m.kind == "completion":
                    v[f"{pre}{k}_count"] = m.count
                    v[f"{pre}{k}_digest"] = m.digest is not None
                    for j, _req, _gen in m.digest or ():
                        v[f"{pre}{k}_dpages{j}"] = True
                if m.kind == "failure":
                    v[f"{pre}f_aborted"] = m.reason == "aborted"
        for w in state.writes:
            q = state.requests[w.data.request]
            r = w.data.request
            # The attempt that issued it: the current one while prefill holds its grant, else
            # (generations are never reused) the one before, the only earlier one a single
            # retry leaves; with more retries a stale write's attempt is not recoverable here.
            a = q.attempt
            if self.retries and w.generation != q.p_gen:
                if q.attempt != 1:
                    raise EncodingError(f"write {w}: which attempt of request {r} issued it?")
                a = 0
            gen, epoch = (q.p_gen, q.p_epoch) if a == q.attempt else (w.generation, w.epoch)
            expected = Write(
                c.requests[r].room,
                gen,
                w.page,
                Tag(r, gen, c.requests[r].tenant),
                epoch,
                w.rank,
            )
            if w != expected or not 0 <= w.rank < self.ranks:
                raise EncodingError(f"write {w} is not derivable from request {r}'s prefill state")
            v[write_var(r, w.page, w.rank, a)] = True
            if self.retries:
                v[f"{att(r, a)}wgen"], v[f"{att(r, a)}wepoch"] = gen, epoch
        for _room, gen, r in state.pending_acks:
            v[f"r{r}.pa"], v[f"r{r}.pa_gen"] = True, gen
        for room, gen, rank in state.acked_ranks:
            # The spec keeps an ack by (room, generation, rank); the encoding with each request
            # that owes the ack for that room and generation (none owing it: 0, as `p_acked`).
            owing = [
                r
                for r in range(self.n)
                if self.rooms[r] == room and (v[f"r{r}.pa_gen"] if v[f"r{r}.pa"] else 0) == gen
            ]
            if self.ranks == 1 or not owing:
                raise EncodingError(f"acked rank {(room, gen, rank)} names no ack a request owes")
            for r in owing:
                v[f"r{r}.pak{rank}"] = True
        for room, gen, pinst in state.orphans:
            # The encoding keeps an orphan with the request whose grant it came from: the one of
            # that room, on that prefill instance, that decode reserved under that generation.
            rs = [
                r
                for r in range(self.n)
                if self.rooms[r] == room and self.config.requests[r].prefill_instance == pinst
            ]
            owner = [r for r in rs if state.requests[r].d_gen == gen] or rs[:1]
            if v[f"r{owner[0]}.orph"]:
                raise EncodingError(f"two orphan grants for request {owner[0]}: {state.orphans}")
            v[f"r{owner[0]}.orph"], v[f"r{owner[0]}.orph_gen"] = True, gen
        for j, page in enumerate(state.pages):
            if page.owner is not None:
                v[f"pg{j}.own"] = True
                v[f"pg{j}.own_req"], v[f"pg{j}.own_gen"] = page.owner
            if len(page.shards) != self.ranks:
                raise EncodingError(f"page {j} has {len(page.shards)} shards, not {self.ranks}")
            for rank, content in enumerate(page.shards):
                if content is not None:
                    sh = shard(j, rank)
                    v[f"{sh}has"] = True
                    v[f"{sh}c_req"] = content.request
                    v[f"{sh}c_gen"] = content.generation
            if page.last_tenant is not None:
                v[f"pg{j}.lt_set"] = True
                v[f"pg{j}.lt"] = self.tenant_names.index(page.last_tenant)
        v["next_gen"] = state.next_generation
        for i, counter in enumerate(state.next_generations, start=1):
            v[f"next_gen{i}"] = counter
        for i, epoch in enumerate((state.prefill_epoch, *state.prefill_epochs)):
            v[epoch_var("prefill_epoch", i)] = epoch
        for j, epoch in enumerate((state.decode_epoch, *state.decode_epochs)):
            v[epoch_var("decode_epoch", j)] = epoch
        dsp = (state.decode_sees_prefill_epoch, *state.decode_sees_prefill_epochs)
        psd = (state.prefill_sees_decode_epoch, *state.prefill_sees_decode_epochs)
        for j, i in self._pairs():
            v[epoch_var("dsp", j, i)] = dsp[j * self.prefill_instances + i]
            v[epoch_var("psd", i, j)] = psd[i * self.decode_instances + j]
        for f in FAULT_FIELDS:
            v[f"f.{f}"] = getattr(state.faults, f)
        if self.retries:
            v["f.retries"] = state.faults.retries
        elif state.faults.retries:
            raise EncodingError(f"{state.faults.retries} retries spent without retries")
        for g in GHOST_FIELDS:
            v[f"gh.{g}"] = getattr(state.ghost, g)
        for name, initial in self.state_fields.items():
            v[f"v.{name}"] = dict(state.variant_fields).get(name, initial)
        return v

    def values(self, model: Any, s: SymState) -> dict[str, Any]:
        """Concrete Python values of a time step's variables in a Z3 model."""
        out: dict[str, Any] = {}
        for name, kind in self.fields:
            val = model.eval(s[name], model_completion=True)
            if kind == "B":
                out[name] = z3.is_true(val)
            else:
                out[name] = val.as_long() if self.width is None else val.as_signed_long()
        return out

    def _tag(self, r: int, gen: int) -> Tag:
        if r == -1:
            return Tag(-1, gen, OTHER_TENANT)
        return Tag(r, gen, self.config.requests[r].tenant)

    def message(self, v: dict[str, Any], kind: str, r: int, a: int = 0) -> Message:
        """The message held in slot (kind, r) of attempt a."""
        out = self._message(v, kind, r, a)
        if self.decode_instances == 1:
            return out
        # Its decode instance, as `spec.effects.message_dinst` gives it (prefill's grant does not
        # change while a message prefill sent about it is in flight: prefill sends only once it
        # holds the grant it ever will, or has stopped).
        dinst = self.config.requests[r].decode_instance
        pages = [j for j in range(self.np) if v[f"r{r}.p_pages{j}"]]
        if out.kind not in ("grant", "abort") and pages:
            dinst = self.config.page_instance(pages[0])
        return out._replace(dinst=dinst)

    def _message(self, v: dict[str, Any], kind: str, r: int, a: int = 0) -> Message:
        k, room, rank, pre = slot(kind), self.rooms[r], slot_rank(kind), att(r, a)
        gen = v[f"{pre}{k}_gen"]
        kind = kind.split(".")[0]
        if kind == "grant":
            pages = tuple(j for j in range(self.np) if v[f"{pre}g_pages{j}"])
            return Message("grant", room, gen, r, pages=pages, epoch=v[f"{pre}g_epoch"], attempt=a)
        if kind == "completion":
            digest = None
            if v[f"{pre}{k}_digest"]:
                digest = tuple((j, r, gen) for j in range(self.np) if v[f"{pre}{k}_dpages{j}"])
            count = v[f"{pre}{k}_count"]
            return Message(
                "completion", room, gen, r, count=count, digest=digest, rank=rank, attempt=a
            )
        if kind == "failure":
            reason = "aborted" if v[f"{pre}f_aborted"] else "rejected"
            return Message("failure", room, gen, r, reason=reason, attempt=a)
        if kind == "lease_failure":
            return Message("failure", room, gen, r, reason=LEASE_EXPIRED, attempt=a)
        return Message(kind, room, gen, r, rank=rank, attempt=a)  # type: ignore[arg-type]

    def write(self, v: dict[str, Any], r: int, j: int, k: int = 0, a: int = 0) -> Write:
        if self.retries:
            gen, epoch = v[f"{att(r, a)}wgen"], v[f"{att(r, a)}wepoch"]
        else:
            gen, epoch = v[f"r{r}.p_gen"], v[f"r{r}.p_epoch"]
        return Write(self.rooms[r], gen, j, self._tag(r, gen), epoch, k)

    def concretize(self, v: dict[str, Any]) -> State:
        """The spec state a time step's values stand for."""

        def pages_of(prefix: str) -> tuple[int, ...]:
            return tuple(j for j in range(self.np) if v[f"{prefix}{j}"])

        reqs = []
        for r in range(self.n):
            read = None
            if v[f"r{r}.read_set"]:
                read = tuple(
                    self._tag(v[f"{rc}_req"], v[f"{rc}_gen"]) if v[f"{rc}_has"] else None
                    for j in pages_of(f"r{r}.read_pages")
                    for rc in (read_shard(r, j, k) for k in range(self.ranks))
                )
            answer = None
            if v[f"r{r}.ans_set"]:
                if v[f"r{r}.ans_ok"]:
                    answer = Answer(ok=True, tags=read or ())
                else:
                    answer = Answer(ok=False, reason=self.reasons[v[f"r{r}.ans_reason"]])
            reqs.append(
                ReqState(
                    submitted=v[f"r{r}.submitted"],
                    answer=answer,
                    p=P_PHASES[v[f"r{r}.p"]],  # type: ignore[arg-type]
                    p_len=v[f"r{r}.p_len"],
                    p_gen=v[f"r{r}.p_gen"],
                    p_pages=pages_of(f"r{r}.p_pages"),
                    p_wrote=v[f"r{r}.p_wrote"],
                    p_epoch=v[f"r{r}.p_epoch"],
                    p_grant_dinst=v[f"r{r}.p_gdinst"],
                    d=D_PHASES[v[f"r{r}.d"]],  # type: ignore[arg-type]
                    d_gen=v[f"r{r}.d_gen"],
                    d_pages=pages_of(f"r{r}.d_pages"),
                    d_awaiting_ack=v[f"r{r}.d_awaiting"],
                    d_cancel=v[f"r{r}.d_cancel"],
                    p_cancel=v[f"r{r}.p_cancel"],
                    d_epoch=v[f"r{r}.d_epoch"],
                    not_as_is=v[f"r{r}.not_as_is"],
                    read=read,
                    accepted_full=v[f"r{r}.acc_full"] if v[f"r{r}.acc_set"] else None,
                    p_lease_expired=self.pull and v[f"r{r}.lease_expired"],
                    attempt=v[f"r{r}.attempt"] if self.retries else 0,
                    **(
                        {
                            field: tuple(k for k in range(self.ranks) if v[f"r{r}.{name}{k}"])
                            for field, name in (
                                ("p_ranks_done", "prd"),
                                ("d_ranks", "drk"),
                                ("d_acks", "dak"),
                            )
                        }
                        if self.ranks > 1
                        else {}
                    ),
                )
            )
        network: list[Message] = []
        lost: list[Message] = []
        for r in range(self.n):
            for a in range(self.attempts):
                for kind in self.slot_kinds:
                    net, gone = (f"{att(r, a)}{slot(kind)}_{w}" for w in ("net", "lost"))
                    if v[net] < 0 or v[gone] < 0:
                        raise EncodingError(f"negative message count in slot {kind} of request {r}")
                    m = self.message(v, kind, r, a) if v[net] + v[gone] else None
                    network += [m] * v[net]  # type: ignore[list-item]
                    lost += [m] * v[gone]  # type: ignore[list-item]
        writes = [
            self.write(v, r, j, k, a)
            for r in range(self.n)
            for a in range(self.attempts)
            for j in range(self.np)
            for k in range(self.ranks)
            if v[write_var(r, j, k, a)]
        ]
        pages = []
        for j in range(self.np):
            owner = (v[f"pg{j}.own_req"], v[f"pg{j}.own_gen"]) if v[f"pg{j}.own"] else None
            shards = [
                self._tag(v[f"{sh}c_req"], v[f"{sh}c_gen"]) if v[f"{sh}has"] else None
                for sh in (shard(j, k) for k in range(self.ranks))
            ]
            lt = self.tenant_names[v[f"pg{j}.lt"]] if v[f"pg{j}.lt_set"] else None
            pages.append(
                PageState(
                    owner=owner, content=shards[0], last_tenant=lt, rank_shards=tuple(shards[1:])
                )
            )
        pending = sorted(
            (self.rooms[r], v[f"r{r}.pa_gen"], r) for r in range(self.n) if v[f"r{r}.pa"]
        )
        orphans = sorted(
            {
                (self.rooms[r], v[f"r{r}.orph_gen"], self.config.requests[r].prefill_instance)
                for r in range(self.n)
                if v[f"r{r}.orph"]
            }
        )
        acked = sorted(
            {
                (self.rooms[r], v[f"r{r}.pa_gen"] if v[f"r{r}.pa"] else 0, k)
                for r in range(self.n)
                for k in range(self.ranks)
                if self.ranks > 1 and v[f"r{r}.pak{k}"]
            }
        )
        fields = {
            name: v[f"v.{name}"]
            for name, initial in sorted(self.state_fields.items())
            if v[f"v.{name}"] != initial
        }
        return State(
            variant_fields=tuple(fields.items()),
            requests=tuple(reqs),
            pages=tuple(pages),
            network=tuple(sorted(network)),
            lost=tuple(sorted(lost)),
            writes=tuple(sorted(writes)),
            next_generation=v["next_gen"],
            next_generations=tuple(v[f"next_gen{i}"] for i in range(1, self.decode_instances)),
            prefill_epoch=v["prefill_epoch"],
            decode_epoch=v["decode_epoch"],
            decode_sees_prefill_epoch=v["dsp"],
            prefill_sees_decode_epoch=v["psd"],
            prefill_epochs=tuple(
                v[epoch_var("prefill_epoch", i)] for i in range(1, self.prefill_instances)
            ),
            decode_epochs=tuple(
                v[epoch_var("decode_epoch", j)] for j in range(1, self.decode_instances)
            ),
            decode_sees_prefill_epochs=tuple(v[epoch_var("dsp", j, i)] for j, i in self._pairs())[
                1:
            ],
            prefill_sees_decode_epochs=tuple(
                v[epoch_var("psd", i, j)]
                for i in range(self.prefill_instances)
                for j in range(self.decode_instances)
            )[1:],
            pending_acks=tuple(pending),
            acked_ranks=tuple(acked),
            orphans=tuple(orphans),
            faults=Faults(
                **{f: v[f"f.{f}"] for f in FAULT_FIELDS},
                retries=v["f.retries"] if self.retries else 0,
            ),
            ghost=Ghost(**{g: v[f"gh.{g}"] for g in GHOST_FIELDS}),
        )

    def action(self, v: dict[str, Any], i: int) -> Action:
        """The spec action of instance i, taken in the state with values v."""
        inst = self.instances[i]
        cls = _CLASSES.get(inst.name) or self.added_kinds[inst.name]
        if inst.name == "decode_receive_write":
            return DecodeReceiveWrite(self.write(v, *write_args(inst.args)))
        if inst.name == "network_fail_transfer":
            return NetworkFailTransfer(self.write(v, *write_args(inst.args)))
        if inst.name == "prefill_send_abort_ack":
            r, *rank = inst.args
            ack = PrefillSendAbortAck(self.rooms[r], v[f"r{r}.pa_gen"], *rank)
            if self.decode_instances == 1:
                return ack
            # The decode instance the abort came from: the one of prefill's grant, else the
            # request's own (`spec.effects.ack_dinst`).
            pages = [j for j in range(self.np) if v[f"r{r}.p_pages{j}"]]
            dinst = self.config.requests[r].decode_instance
            if pages:
                dinst = self.config.page_instance(pages[0])
            return replace(ack, dinst=dinst)
        if inst.name == "prefill_send_completion" and len(inst.args) == 2:
            return PrefillSendCompletion(inst.args[0], rank=inst.args[1])
        if inst.args and isinstance(inst.args[0], str):
            action: Action = cls(self.message(v, *slot_args(inst.args)))
            return action
        action = cls(*inst.args)
        return action


_CLASSES: dict[str, Any] = {
    snake_case(cls.__name__): cls
    for cls in (
        RouterRetryRequest,
        RouterSubmitRequest,
        PrefillAdmitRequest,
        PrefillRejectRequest,
        DecodeAdmitRequest,
        DecodeRejectRequest,
        DecodeReservePages,
        PrefillReceiveGrant,
        PrefillWritePage,
        DecodeReceiveWrite,
        PrefillSendCompletion,
        DecodeReceiveCompletion,
        DecodeReceiveFailure,
        DecodeReceiveCancel,
        DecodeGenerate,
        DecodeAnswer,
        DecodeReleasePages,
        PrefillReceiveAbort,
        PrefillReceiveCancel,
        PrefillSendAbortAck,
        DecodeReceiveAbortAck,
        DecodeReleaseTimeout,
        DecodeDetectPrefillRestart,
        PrefillDetectDecodeRestart,
        RetransmitMessage,
        ClientCancelRequest,
        DecodeWaitingTimeout,
        PrefillAbortRequest,
        PrefillWriteError,
        PrefillRestart,
        DecodeRestart,
        DecodeSuspectPrefillDead,
        NetworkDropMessage,
        NetworkDuplicateMessage,
        PrefillLeaseExpire,
        NetworkFailTransfer,
    )
}
