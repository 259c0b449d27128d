"""Proofs for any pool size: the reference protocol's safety core over unbounded sets.

`kvhandoff check --engine prove` discharges, in the style of Ivy/mypyvy, the obligations that make
the invariants of `spec/invariants.py` (their parametric versions below, same names) and the safety
properties an inductive invariant of an abstract model in which pages, requests, tenants and rooms
are *uninterpreted sorts* (`DeclareSort`): a model of the solver may have any number of each, so
an `unsat` answer holds for every pool size and every number of requests and tenants.

    initiation    Init(s)                        ->  I(s)            for each invariant or property I
    consecution   Inv(s) /\\ guard_a /\\ T_a(s,s')  ->  I(s')           for each action a and each I
    safety        Inv(s)                         ->  p(s)            for each safety property p

where Inv is the conjunction of all invariants and properties. A failed obligation names its action
and invariant, and comes with its counterexample to induction (a finite model: the sizes of the
sorts and the interesting function values).

What the abstract model keeps and what it abstracts (its correspondence with `spec/`):

* Decode's page table (`own`, `own_req`, `own_gen`), page contents (`has`, `c_req`, `c_gen`: the
  spec's ghost `Tag`; the tenant is `tenant(c_req)`), decode's and prefill's phases (the spec's
  phase codes), generations (Ints) and the generation counter, `d_pages` (`granted`), prefill's
  grant (`p_gen`, `p_pages`) and the pages it wrote (`wrote`), `not_as_is` and the answer.
* Messages are *sent facts* that never disappear: a grant, or a completion with its generation and
  digest pages, once sent can be received any number of times, at any later time. This covers the
  spec's loss + retransmission, duplication, reordering and delay.
* A page write, once issued, stays in flight for ever and may land (again) at any time: late writes.
* Completion: sent at any time after the grant, carrying the pages written so far (the spec sends
  it once every granted page is written, which is one of these behaviours).
* Reservation takes *any* set of free pages (the spec takes the first `pages` free ones).
* Every way decode gives up on a request (waiting timeout, a cancel reaching it, failure notice,
  failed validation, prefill restart detected) is one action `decode_fail`; every way prefill
  stops (abort, a cancel reaching it, restart, decode restart detected) is `prefill_stop`; the
  router may answer any unanswered request with an error at any time (`router_answer_error`: the
  client's cancel is answered so, before it reaches the workers). Decode restart clears its page table
  (zeroing pages when the design scrubs).
* Prompt lengths are uninterpreted predicates (`too_long_for_window/prefill/decode`): every
  configuration at once.

Every step of the spec maps to zero or more steps of this model (so it over-approximates the spec:
whatever is proved here holds of the spec for every configuration). Design options it follows:
`scrub`, `check_generation`, `validation` (`full`; any other value is treated as no validation,
which over-approximates), `generations_persist`, and `oversize` (`reject` or carry on with a
placeholder / truncation). Designs with one-sided writes (and their release fences) are outside
it: `prove` falls back to the fixed-configuration obligations for them (scope `fixed-config`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import z3

from kvhandoff.model_checker.z3_encoding import D_PHASES, P_PHASES, D, P
from kvhandoff.spec.variants import Design

Req = z3.DeclareSort("Req")
Page = z3.DeclareSort("Page")
Tenant = z3.DeclareSort("Tenant")
Room = z3.DeclareSort("Room")
INT, BOOL = z3.IntSort(), z3.BoolSort()

# name -> (argument sorts, result sort). Rigid symbols never change.
RIGID = {
    "tenant": ((Req,), Tenant),
    "room": ((Req,), Room),
    "too_long_for_window": ((Req,), BOOL),
    "too_long_for_prefill": ((Req,), BOOL),
    "too_long_for_decode": ((Req,), BOOL),
}
SYMBOLS: dict[str, tuple[tuple[Any, ...], Any]] = {
    "submitted": ((Req,), BOOL),
    "p": ((Req,), INT),
    "d": ((Req,), INT),
    "p_gen": ((Req,), INT),
    "d_gen": ((Req,), INT),
    "not_as_is": ((Req,), BOOL),
    "ans_set": ((Req,), BOOL),
    "ans_ok": ((Req,), BOOL),
    "grant_sent": ((Req,), BOOL),
    "grant_gen": ((Req,), INT),
    "comp_sent": ((Req,), BOOL),
    "comp_gen": ((Req,), INT),
    "granted": ((Req, Page), BOOL),
    "p_pages": ((Req, Page), BOOL),
    "wrote": ((Req, Page), BOOL),
    "grant_pages": ((Req, Page), BOOL),
    "comp_pages": ((Req, Page), BOOL),
    "own": ((Page,), BOOL),
    "own_req": ((Page,), Req),
    "own_gen": ((Page,), INT),
    "has": ((Page,), BOOL),
    "c_req": ((Page,), Req),
    "c_gen": ((Page,), INT),
    "next_gen": ((), INT),
    "bad_read": ((), BOOL),
    "bad_tenant": ((), BOOL),
    "bad_cover": ((), BOOL),
    "late": ((), BOOL),
}


class St:
    """One state: `s.f(x)` applies symbol f (a constant when it takes no argument)."""

    def __init__(self, syms: dict[str, Any]) -> None:
        self.syms = syms

    def __getattr__(self, name: str) -> Any:
        return self.syms[name]


def _symbol(name: str, args: tuple[Any, ...], result: Any, suffix: str) -> Any:
    if not args:
        return z3.Const(f"{name}{suffix}", result)
    return z3.Function(f"{name}{suffix}", *args, result)


def state(suffix: str = "") -> St:
    syms = {n: _symbol(n, a, r, "") for n, (a, r) in RIGID.items()}
    syms.update({n: _symbol(n, a, r, suffix) for n, (a, r) in SYMBOLS.items()})
    return St(syms)


def _in(x: Any, names: tuple[str, ...], table: dict[str, int]) -> Any:
    return z3.Or([x == table[n] for n in names])


r1, r2 = z3.Consts("r1 r2", Req)
q1 = z3.Const("q1", Page)

Update = dict[str, Callable[..., Any]]
"""New value of a symbol, as a function of its arguments (a value, for constants)."""


@dataclass
class Action:
    name: str
    params: tuple[Any, ...]
    guard: Callable[[St], Any]
    update: Callable[[St], Update]
    extra: Callable[[St], Any] = field(default=lambda s: z3.BoolVal(True))
    """Constraints on the action's parameter functions (e.g. the pages it reserves are free)."""


def actions(d: Design, tag: str = "") -> list[Action]:
    """The abstract model's actions (see the module docstring for how they cover the spec's).
    `tag` names the parameters apart: an unrolling takes a fresh set at every step."""
    r, t = z3.Consts(f"a_r{tag} a_t{tag}", Req)
    q = z3.Const(f"a_q{tag}", Page)
    chosen = z3.Function(f"a_chosen{tag}", Page, BOOL)
    stop_lost = z3.Bool(f"a_lost{tag}")
    validated = "full" == d.validation

    def answer_error(s: St, who: Any) -> Update:
        # A client keeps the first answer it got (the spec's `answer_error` update): an error
        # after an OK answer changes nothing.
        return {
            "ans_set": lambda x: z3.Or(s.ans_set(x), x == who),
            "ans_ok": lambda x: z3.And(s.ans_ok(x), z3.Or(x != who, s.ans_set(x))),
        }

    def set1(f: Any, who: Any, value: Any) -> Callable[[Any], Any]:
        return lambda x: z3.If(x == who, value, f(x))

    def router_submit_request(s: St) -> Update:
        long = s.too_long_for_window(r)
        return {
            "submitted": set1(s.submitted, r, z3.BoolVal(True)),
            "not_as_is": set1(s.not_as_is, r, z3.Or(s.not_as_is(r), long)),
            "ans_set": set1(s.ans_set, r, z3.Or(s.ans_set(r), long)),
            "ans_ok": set1(s.ans_ok, r, z3.And(s.ans_ok(r), z3.Not(long))),
            "p": set1(s.p, r, z3.If(long, s.p(r), P["received"])),
            "d": set1(s.d, r, z3.If(long, s.d(r), D["received"])),
        }

    def prefill_admit_request(s: St) -> Update:
        phase = z3.If(s.p_gen(r) != 0, P["granted"], P["admitted"])
        return {"p": set1(s.p, r, phase)}

    def prefill_reject_request(s: St) -> Update:
        if d.oversize == "reject":
            phase: Any = z3.IntVal(P["rejected"])
        else:  # placeholder or truncation: prefill carries on with a prompt not as sent
            phase = z3.If(s.p_gen(r) != 0, P["granted"], P["admitted"])
        return {"p": set1(s.p, r, phase), "not_as_is": set1(s.not_as_is, r, z3.BoolVal(True))}

    def decode_admit_request(s: St) -> Update:
        return {"d": set1(s.d, r, z3.IntVal(D["admitted"]))}

    def decode_reject_request(s: St) -> Update:
        return {
            "d": set1(s.d, r, z3.IntVal(D["rejected"])),
            "not_as_is": set1(s.not_as_is, r, z3.BoolVal(True)),
            **answer_error(s, r),
        }

    def decode_reserve_pages(s: St) -> Update:
        g = s.next_gen
        return {
            "own": lambda x: z3.Or(s.own(x), chosen(x)),
            "own_req": lambda x: z3.If(chosen(x), r, s.own_req(x)),
            "own_gen": lambda x: z3.If(chosen(x), g, s.own_gen(x)),
            "granted": lambda x, y: z3.If(x == r, chosen(y), s.granted(x, y)),
            "grant_pages": lambda x, y: z3.If(x == r, chosen(y), s.grant_pages(x, y)),
            "d": set1(s.d, r, z3.IntVal(D["reserved"])),
            "d_gen": set1(s.d_gen, r, g),
            "grant_sent": set1(s.grant_sent, r, z3.BoolVal(True)),
            "grant_gen": set1(s.grant_gen, r, g),
            "next_gen": lambda: g + 1,
        }

    def prefill_receive_grant(s: St) -> Update:
        phase = z3.If(s.p(r) == P["admitted"], P["granted"], s.p(r))
        return {
            "p": set1(s.p, r, phase),
            "p_gen": set1(s.p_gen, r, s.grant_gen(r)),
            "p_pages": lambda x, y: z3.If(x == r, s.grant_pages(x, y), s.p_pages(x, y)),
        }

    def prefill_write_page(s: St) -> Update:
        return {"wrote": lambda x, y: z3.Or(s.wrote(x, y), z3.And(x == r, y == q))}

    def decode_receive_write(s: St) -> Update:
        # The write of (r, page q) carries r's room, prefill's generation and r's data.
        own_is_data = z3.And(s.own_req(q) == r, s.own_gen(q) == s.p_gen(r))
        return {
            "has": lambda x: z3.Or(s.has(x), x == q),
            "c_req": lambda x: z3.If(x == q, r, s.c_req(x)),
            "c_gen": lambda x: z3.If(x == q, s.p_gen(r), s.c_gen(x)),
            "late": lambda: z3.Or(s.late, z3.Not(own_is_data)),
        }

    def write_matches(s: St) -> Any:
        return z3.And(s.own(q), s.room(s.own_req(q)) == s.room(r), s.own_gen(q) == s.p_gen(r))

    def prefill_send_completion(s: St) -> Update:
        return {
            "p": set1(s.p, r, z3.IntVal(P["completed"])),
            "comp_sent": set1(s.comp_sent, r, z3.BoolVal(True)),
            "comp_gen": set1(s.comp_gen, r, s.p_gen(r)),
            "comp_pages": lambda x, y: z3.If(x == r, s.wrote(x, y), s.comp_pages(x, y)),
        }

    def completion_matches(s: St) -> Any:
        """Completion of request r accepted for request t."""
        cond = [s.comp_sent(r), s.d(t) == D["reserved"], s.room(t) == s.room(r)]
        if d.check_generation:
            cond.append(s.d_gen(t) == s.comp_gen(r))
        if validated:
            page = z3.Const("v_q", Page)
            cond.append(
                z3.ForAll(
                    [page],
                    z3.And(
                        s.comp_pages(r, page) == s.granted(t, page),
                        z3.Implies(
                            s.granted(t, page),
                            z3.And(
                                s.has(page),
                                s.c_req(page) == r,
                                s.c_gen(page) == s.comp_gen(r),
                            ),
                        ),
                    ),
                )
            )
        return z3.And(cond)

    def own_data(s: St, who: Any, page: Any) -> Any:
        return z3.And(s.has(page), s.c_req(page) == who, s.c_gen(page) == s.d_gen(who))

    def decode_receive_completion(s: St) -> Update:
        # bad_cover: some granted page of t does not hold t's own data (the ghost accepted_full).
        uncovered = z3.And(s.granted(t, q), z3.Not(own_data(s, t, q)))
        return {
            "d": set1(s.d, t, z3.IntVal(D["validated"])),
            "bad_cover": lambda: z3.Or(s.bad_cover, uncovered),
        }

    def decode_generate(s: St) -> Update:
        misread = z3.And(s.granted(r, q), z3.Not(own_data(s, r, q)))
        foreign = z3.And(s.granted(r, q), s.has(q), s.tenant(s.c_req(q)) != s.tenant(r))
        return {
            "d": set1(s.d, r, z3.IntVal(D["generated"])),
            "bad_read": lambda: z3.Or(s.bad_read, misread),
            "bad_tenant": lambda: z3.Or(s.bad_tenant, foreign),
        }

    def decode_answer(s: St) -> Update:
        return {
            "d": set1(s.d, r, z3.IntVal(D["answered"])),
            "ans_set": set1(s.ans_set, r, z3.BoolVal(True)),
            "ans_ok": set1(s.ans_ok, r, z3.Or(s.ans_ok(r), z3.Not(s.ans_set(r)))),
        }

    def decode_release_pages(s: St) -> Update:
        out: Update = {
            "own": lambda x: z3.And(s.own(x), z3.Not(s.granted(r, x))),
            "granted": lambda x, y: z3.And(s.granted(x, y), x != r),
            "d": set1(s.d, r, z3.IntVal(D["released"])),
        }
        if d.scrub:
            out["has"] = lambda x: z3.And(s.has(x), z3.Not(s.granted(r, x)))
        return out

    def decode_fail(s: St) -> Update:
        return {"d": set1(s.d, r, z3.IntVal(D["failed"])), **answer_error(s, r)}

    def prefill_stop(s: St) -> Update:
        return {"p": set1(s.p, r, z3.If(stop_lost, P["lost"], P["aborted"]))}

    def router_answer_error(s: St) -> Update:
        return answer_error(s, r)

    def decode_restart(s: St) -> Update:
        def keep(x: Any) -> Any:
            return z3.And(
                _in(s.d(x), ("none", "rejected", "released", "lost"), D),
                z3.Not(z3.Exists([q1], s.granted(x, q1))),
            )

        out: Update = {
            "own": lambda x: z3.BoolVal(False),
            "granted": lambda x, y: z3.BoolVal(False),
            "d": lambda x: z3.If(keep(x), s.d(x), D["lost"]),
            # The router answers an error to the clients still waiting; an answer given stays.
            "ans_set": lambda x: z3.Or(s.ans_set(x), z3.Not(keep(x))),
        }
        if d.scrub:
            out["has"] = lambda x: z3.BoolVal(False)
        if not d.generations_persist:
            out["next_gen"] = lambda: z3.IntVal(1)
        return out

    def free_chosen(s: St) -> Any:
        return z3.ForAll([q1], z3.Implies(chosen(q1), z3.Not(s.own(q1))))

    live_d = ("received", "admitted", "reserved", "validated", "generated")
    return [
        Action(
            "router_submit_request",
            (r,),
            lambda s: z3.Not(s.submitted(r)),
            router_submit_request,
        ),
        Action(
            "prefill_admit_request",
            (r,),
            lambda s: z3.And(s.p(r) == P["received"], z3.Not(s.too_long_for_prefill(r))),
            prefill_admit_request,
        ),
        Action(
            "prefill_reject_request",
            (r,),
            lambda s: z3.And(s.p(r) == P["received"], s.too_long_for_prefill(r)),
            prefill_reject_request,
        ),
        Action(
            "decode_admit_request",
            (r,),
            lambda s: z3.And(s.d(r) == D["received"], z3.Not(s.too_long_for_decode(r))),
            decode_admit_request,
        ),
        Action(
            "decode_reject_request",
            (r,),
            lambda s: z3.And(s.d(r) == D["received"], s.too_long_for_decode(r)),
            decode_reject_request,
        ),
        Action(
            "decode_reserve_pages",
            (r, chosen),
            lambda s: s.d(r) == D["admitted"],
            decode_reserve_pages,
            free_chosen,
        ),
        Action(
            "prefill_receive_grant",
            (r,),
            lambda s: z3.And(
                s.grant_sent(r), _in(s.p(r), ("received", "admitted"), P), s.p_gen(r) == 0
            ),
            prefill_receive_grant,
        ),
        Action(
            "prefill_write_page",
            (r, q),
            lambda s: z3.And(s.p(r) == P["granted"], s.p_pages(r, q)),
            prefill_write_page,
        ),
        Action(
            "decode_receive_write",
            (r, q),
            lambda s: z3.And(s.wrote(r, q), write_matches(s)),
            decode_receive_write,
        ),
        Action(
            "prefill_send_completion",
            (r,),
            lambda s: s.p(r) == P["granted"],
            prefill_send_completion,
        ),
        Action(
            "decode_receive_completion",
            (r, t, q),
            completion_matches,
            decode_receive_completion,
        ),
        Action("decode_generate", (r, q), lambda s: s.d(r) == D["validated"], decode_generate),
        Action("decode_answer", (r,), lambda s: s.d(r) == D["generated"], decode_answer),
        Action(
            "decode_release_pages",
            (r,),
            lambda s: _in(s.d(r), ("answered", "failed"), D),
            decode_release_pages,
        ),
        Action("decode_fail", (r,), lambda s: _in(s.d(r), live_d, D), decode_fail),
        Action(
            "prefill_stop",
            (r, stop_lost),
            lambda s: _in(s.p(r), ("received", "admitted", "granted"), P),
            prefill_stop,
        ),
        Action("router_answer_error", (r,), lambda s: s.submitted(r), router_answer_error),
        Action("decode_restart", (), lambda s: z3.BoolVal(True), decode_restart),
    ]


def init(s: St) -> Any:
    x, y = z3.Const("i_r", Req), z3.Const("i_q", Page)
    return z3.And(
        z3.ForAll(
            [x],
            z3.And(
                z3.Not(s.submitted(x)),
                s.p(x) == P["none"],
                s.d(x) == D["none"],
                s.p_gen(x) == 0,
                s.d_gen(x) == 0,
                z3.Not(s.not_as_is(x)),
                z3.Not(s.ans_set(x)),
                z3.Not(s.ans_ok(x)),
                z3.Not(s.grant_sent(x)),
                z3.Not(s.comp_sent(x)),
                s.grant_gen(x) == 0,
                s.comp_gen(x) == 0,
            ),
        ),
        z3.ForAll(
            [x, y],
            z3.And(
                z3.Not(s.granted(x, y)),
                z3.Not(s.p_pages(x, y)),
                z3.Not(s.wrote(x, y)),
                z3.Not(s.grant_pages(x, y)),
                z3.Not(s.comp_pages(x, y)),
            ),
        ),
        z3.ForAll([y], z3.And(z3.Not(s.own(y)), z3.Not(s.has(y)))),
        s.next_gen == 1,
        z3.Not(s.bad_read),
        z3.Not(s.bad_tenant),
        z3.Not(s.bad_cover),
        z3.Not(s.late),
    )


def properties(s: St) -> dict[str, Any]:
    """The `ALWAYS` properties over the abstract state: the formulas of spec/properties.py
    themselves where this model keeps what they read (`logic_z3.any_size_properties`), else the
    model's own statement of the property (`own_properties`), over its history flags:
    `properties_left_out()` says which and why."""
    from kvhandoff.model_checker.logic_z3 import any_size_properties
    from kvhandoff.spec.properties import ALWAYS

    read, _why = any_size_properties(s)
    own = own_properties(s)
    missing = [p.name for p in ALWAYS if p.name not in read and p.name not in own]
    assert not missing, f"the any-size model states no form of {missing}"
    return {p.name: read[p.name] if p.name in read else own[p.name] for p in ALWAYS}


def properties_left_out() -> dict[str, str]:
    """For each property this model states in its own terms, why it cannot read the formula."""
    from kvhandoff.model_checker.logic_z3 import any_size_properties

    return any_size_properties(state())[1]


def own_properties(s: St) -> dict[str, Any]:
    """This model's own statement of the properties whose formulas it cannot read
    (`properties_left_out()` says why). A bad read, a read of another tenant's data and an
    accepted completion that does not cover every page are history flags set by the action where
    they happen (`bad_read`, `bad_tenant`, `bad_cover`): the model does not keep the read or the
    acceptance; it keeps which pages prefill wrote (`wrote`), not how many."""
    return {
        "decode_reads_only_validated_pages": z3.Not(s.bad_read),
        "no_cross_tenant_read": z3.Not(s.bad_tenant),
        "accepted_completion_implies_full_coverage": z3.Not(s.bad_cover),
        "rejected_request_gets_error_not_output": z3.ForAll(
            [r1, q1],
            z3.Implies(
                s.not_as_is(r1),
                z3.And(z3.Not(s.wrote(r1, q1)), z3.Not(z3.And(s.ans_set(r1), s.ans_ok(r1)))),
            ),
        ),
    }


def invariants(s: St) -> dict[str, Any]:
    """The invariants `prove` uses: `well_formed` (facts about this model's encoding) and, for
    each invariant of spec/invariants.py, the clauses of that very formula the model can read
    (`logic_z3.any_size_clauses`; `left_out()` lists the others, which the fixed-configuration
    engines check)."""
    from kvhandoff.model_checker.logic_z3 import any_size_clauses
    from kvhandoff.spec.invariants import INVARIANTS

    out = {"well_formed": well_formed(s)}
    for inv in INVARIANTS:
        kept, _left = any_size_clauses(inv.formula, s)
        out[inv.name] = z3.And(kept)
    return out


def left_out() -> dict[str, list[str]]:
    """For each invariant, why each clause the any-size model cannot read is left out."""
    from kvhandoff.model_checker.logic_z3 import any_size_clauses
    from kvhandoff.spec.invariants import INVARIANTS

    s = state()
    return {inv.name: any_size_clauses(inv.formula, s)[1] for inv in INVARIANTS}


def well_formed(s: St) -> Any:
    """Facts about this model's encoding: phases are codes of the spec's phases, generations are
    not negative, and only an answer given can be OK (the spec's `answer.ok` lives in the
    answer)."""
    x = r1
    return z3.ForAll(
        [x],
        z3.And(
            s.p(x) >= 0,
            s.p(x) < len(P_PHASES),
            s.d(x) >= 0,
            s.d(x) < len(D_PHASES),
            s.p_gen(x) >= 0,
            z3.Implies(s.ans_ok(x), s.ans_set(x)),
        ),
    )


def supports(d: Design) -> str | None:
    """Why the any-size model cannot represent design d (None when it can)."""
    if d.transfer != "push":
        return "the pull path (read-time data, lease expiry, failed reads) is outside the any-size model"
    if d.write_path != "receiver_checked":
        return "one-sided writes and their release fences are outside the any-size model"
    # `binds_request` needs no refusal: the model names a grant, a write and a completion by the
    # request they were made for, and with request-keyed matching the binding only removes
    # behaviours (m10 and generation_reset_on_restart, unbound, are in the model, as before the
    # option existed). Room-keyed matching lets another request take a grant: not in the model.
    if d.matching != "request":
        return "room-keyed matching (a grant, abort or failure notice taken by another request on its room) is outside the any-size model"
    return None


@dataclass
class Obligation:
    kind: str  # initiation, consecution, safety
    invariant: str
    action: str | None
    verdict: str  # proved, failed, unknown
    seconds: float
    counterexample: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "invariant": self.invariant,
            "action": self.action,
            "verdict": self.verdict,
            "seconds": round(self.seconds, 4),
        }
        if self.counterexample is not None:
            out["counterexample"] = self.counterexample
        return out


def _next_state(s: St, update: Update, tag: str) -> tuple[St, list[Any]]:
    """s' and the frame axioms defining the updated symbols."""
    syms = dict(s.syms)
    axioms = []
    for name, fn in update.items():
        args, result = SYMBOLS[name]
        new = _symbol(name, args, result, tag)
        if not args:
            axioms.append(new == fn())
        else:
            xs = [z3.Const(f"u_{name}_{i}", a) for i, a in enumerate(args)]
            axioms.append(z3.ForAll(xs, new(*xs) == fn(*xs)))
        syms[name] = new
    return St(syms), axioms


def _show(name: str, value: Any) -> str:
    """Phase codes by name (the spec's `DecodePhase` / `PrefillPhase`)."""
    names: tuple[str, ...] | None = {"d": D_PHASES, "p": P_PHASES}.get(name)
    if names is not None and z3.is_int_value(value):
        code = int(value.as_long())
        if 0 <= code < len(names):
            return names[code]
    return str(value)


def _describe(model: Any, s: St, s2: St | None) -> dict[str, Any]:
    """A readable finite counterexample to induction: sort sizes and function tables."""
    out: dict[str, Any] = {}
    for sort in (Req, Page, Tenant, Room):
        universe = model.get_universe(sort)
        out[f"{sort}s"] = 0 if universe is None else len(universe)
    for label, st in (("before", s), ("after", s2)):
        if st is None:
            continue
        table: dict[str, Any] = {}
        reqs = model.get_universe(Req) or []
        pages = model.get_universe(Page) or []
        for name in ("d", "p", "d_gen", "p_gen", "not_as_is", "ans_ok"):
            table[name] = {
                str(x): _show(name, model.eval(st.syms[name](x), model_completion=True))
                for x in reqs
            }
        for name in ("own", "own_req", "own_gen", "has", "c_req", "c_gen"):
            table[name] = {
                str(x): str(model.eval(st.syms[name](x), model_completion=True)) for x in pages
            }
        table["granted"] = [
            f"{x}:{y}"
            for x in reqs
            for y in pages
            if z3.is_true(model.eval(st.syms["granted"](x, y), model_completion=True))
        ]
        table["next_gen"] = str(model.eval(st.syms["next_gen"], model_completion=True))
        out[label] = table
    return out


def prove_any_size(
    design: Design,
    timeout: float | None = None,
    weaken: dict[str, Callable[[St], Any]] | None = None,
    only: set[str] | None = None,
) -> list[Obligation]:
    """Discharge every obligation; `weaken` replaces invariants by name (tests break one).
    `only`: the claims (invariants and properties) to assume and prove, the others dropped."""
    s = state()
    invs = invariants(s)
    if weaken:
        invs.update({name: f(s) for name, f in weaken.items()})
    props = properties(s)
    if only is not None:
        invs = {n: f for n, f in invs.items() if n in only}
        props = {n: f for n, f in props.items() if n in only}
    claims = {**invs, **props}
    inv_all = z3.And(list(claims.values()))
    out: list[Obligation] = []

    def check(kind: str, name: str, action: str | None, *assertions: Any, after: St | None) -> None:
        started = time.perf_counter()
        solver = z3.Solver()
        if timeout is not None:
            solver.set("timeout", max(1, int(timeout * 1000)))
        solver.add(*assertions)
        answer = solver.check()
        seconds = time.perf_counter() - started
        if answer == z3.unsat:
            out.append(Obligation(kind, name, action, "proved", seconds))
        elif answer == z3.sat:
            cex = _describe(solver.model(), s, after)
            out.append(Obligation(kind, name, action, "failed", seconds, cex))
        else:
            out.append(Obligation(kind, name, action, "unknown", seconds))

    for name, claim in claims.items():
        check("initiation", name, None, init(s), z3.Not(claim), after=None)
    for act in actions(design):
        s2, axioms = _next_state(s, act.update(s), "'")
        after = {**invariants(s2), **properties(s2)}
        if weaken:
            after.update({name: f(s2) for name, f in weaken.items()})
        for name in claims:
            check(
                "consecution",
                name,
                act.name,
                inv_all,
                act.guard(s),
                act.extra(s),
                *axioms,
                z3.Not(after[name]),
                after=s2,
            )
    for name, prop in props.items():
        # The properties are conjuncts of the inductive invariant, so this is immediate; it is
        # listed so that every claim's role is explicit.
        check("safety", name, None, inv_all, z3.Not(prop), after=None)
    return out
