"""A variant that overrides an action: prefill's rejection path, rewritten in a few lines.

Run it:  kvhandoff check --variant tests/data/python_variants/override_reject.py

Design options cover the catalogued bugs; a change that is not an option can replace the effect
of any action. This one re-creates SGLang's placeholder path (M1) by hand: the over-long request is
kept, one page long, and nobody is told. The explicit engine runs it unchanged; a Z3 engine that
cannot translate a Python override says so (exit 3) instead of skipping it.

This is the Python-function form of examples/variant_replace_effect.py, which every engine checks:
it stays here, beside the tests that pin the two forms to the same state graph and the Z3 engines'
refusal of a Python function, for what the formula language cannot say.
"""

from dataclasses import replace
from typing import Any

from kvhandoff.spec.config import Config
from kvhandoff.spec.state import State
from kvhandoff.spec.variants import REFERENCE


def placeholder_reject(config: Config, state: State, action: Any) -> State:
    r = action.request
    req = state.requests[r]
    phase = "granted" if req.p_gen else "admitted"  # the grant may already be here
    req = replace(req, p=phase, p_len=1, not_as_is=True)
    return replace(state, requests=(*state.requests[:r], req, *state.requests[r + 1 :]))


VARIANT = replace(
    REFERENCE.derive(
        "override_reject",
        "Prefill's rejection path keeps the request as a one-page placeholder (hand-written).",
        breaks=("rejected_request_gets_error_not_output",),
    ),
    step_overrides={"prefill_reject_request": placeholder_reject},
)
