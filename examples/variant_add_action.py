"""A variant that adds an action and a state field, written as formulas: every engine checks it.

Run it:  kvhandoff check --variant examples/variant_add_action.py --engine all

The same proposal as tests/data/python_variants/state_field.py: "decode may preempt a reserved request
once: fail it, and return its pages to the pool at once; it is being thrown away, so skip the
zeroing" (vLLM's recompute preemption, SGLang's retraction, without the scrub). It needs an action
the rulebook does not have (`decode_preempt_request`) and a state field that bounds how often it
happens (`preemptions`). Here the guard and the effect are formulas over the vocabulary and the
state field is a symbol of its own (`spec.logic.state_field`), so the Z3 engines read them too:
BMC and k-induction find the explorer's run where a preempted request's half-written pages
return to the pool holding its tenant's data (`freed_pages_hold_no_readable_data`), and `prove`
refutes it on the fixed configuration (the any-size model has no place for an added action).
"""

from dataclasses import dataclass

from kvhandoff.spec.effects import answer_error, assign, each, effect, send
from kvhandoff.spec.logic import PAGE, And, guard, state_field
from kvhandoff.spec.variants import REFERENCE
from kvhandoff.spec.vocabulary import d, d_gen, d_holds, owned


@dataclass(frozen=True)
class DecodePreemptRequest:
    """Decode evicts a reserved request to make room for others."""

    request: int


# The variant's own state: how many preemptions have happened (at most one, so the explorer's
# state space stays finite). Declared once here and in `state_fields` below.
preemptions = state_field("preemptions", 0, "how many requests decode has preempted")

preemptible = guard(lambda r: And(d(r) == "reserved", preemptions() < 1))

# The pages go back to the pool without zeroing: their owner is cleared, their data stays.
# Prefill is told to stop, as for any failure, and the client gets an error.
preempt = effect(
    lambda r: [
        each(
            PAGE,
            lambda q: [
                assign(owned(q), False, when=d_holds(r, q)),
                assign(d_holds(r, q), False),
            ],
        ),
        answer_error(r, "preempted by decode"),
        assign(d(r), "failed"),
        send("abort", r, gen=d_gen(r)),
        assign(preemptions(), preemptions() + 1),
    ]
)

VARIANT = REFERENCE.derive(
    "preempt_without_scrub_formula",
    "Decode may preempt a reserved request and free its pages without zeroing them (formulas).",
    breaks=("freed_pages_hold_no_readable_data",),
    extra_action_types=(DecodePreemptRequest,),
    guard_overrides={"decode_preempt_request": preemptible},
    step_overrides={"decode_preempt_request": preempt},
    state_fields={"preemptions": 0},
    # The preemption is the only disruption this change needs: checked with no other fault.
    config={"max_faults": 0},
)
