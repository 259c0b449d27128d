"""A variant that adds state and an action: decode preempts a request to free memory.

Run it:  kvhandoff check --variant tests/data/python_variants/state_field.py

Engines preempt running requests when the KV pool runs short (vLLM's recompute preemption,
SGLang's retraction). The proposal: "decode may preempt a reserved request once: fail it, and
return its pages to the pool at once; it is being thrown away, so skip the zeroing". It needs an
action the rulebook does not have (`decode_preempt_request`) and a state field that bounds how
often it happens (`preemptions`), so that the explorer's state space stays finite. The checker
answers with the run where a preempted request's half-written pages return to the pool holding
its tenant's data: fail-closed release is gone (`freed_pages_hold_no_readable_data`). A Z3 engine
says it cannot translate the added action and state field (exit 3).

This is the Python-function form of examples/variant_add_action.py, which every engine checks: it
stays here, beside the tests that pin the two forms to the same state graph and the Z3 engines'
refusal of Python functions, for what the formula language cannot say.
"""

from dataclasses import dataclass, replace

from kvhandoff.spec.config import Config
from kvhandoff.spec.state import Answer, Message, State
from kvhandoff.spec.variants import REFERENCE


@dataclass(frozen=True)
class DecodePreemptRequest:
    """Decode evicts a reserved request to make room for others."""

    request: int


def preemptible(config: Config, state: State) -> list[DecodePreemptRequest]:
    if VARIANT.get(state, "preemptions") >= 1:
        return []
    return [DecodePreemptRequest(r) for r, req in enumerate(state.requests) if req.d == "reserved"]


def preempt(config: Config, state: State, action: DecodePreemptRequest) -> State:
    r = action.request
    req = state.requests[r]
    # The pages go back to the pool without zeroing: their owner is cleared, their data stays.
    pages = tuple(
        replace(p, owner=None) if i in req.d_pages else p for i, p in enumerate(state.pages)
    )
    answer = req.answer or Answer(ok=False, reason="preempted by decode")
    req = replace(req, d="failed", d_pages=(), answer=answer)
    requests = (*state.requests[:r], req, *state.requests[r + 1 :])
    # Prefill is told to stop, as for any failure.
    abort = Message("abort", config.requests[r].room, state.requests[r].d_gen, r)
    network = tuple(sorted((*state.network, abort)))
    state = replace(state, requests=requests, pages=pages, network=network)
    return VARIANT.put(state, "preemptions", VARIANT.get(state, "preemptions") + 1)


VARIANT = replace(
    REFERENCE.derive(
        "preempt_without_scrub",
        "Decode may preempt a reserved request and free its pages without zeroing them.",
        breaks=("freed_pages_hold_no_readable_data",),
    ),
    extra_actions=preemptible,
    step_overrides={"decode_preempt_request": preempt},
    extra_action_types=(DecodePreemptRequest,),
    state_fields={"preemptions": 0},
    # The preemption is the only disruption this change needs: checked with no other fault,
    # which keeps the added branching small (see `Variant.config`).
    config={"max_faults": 0},
)
