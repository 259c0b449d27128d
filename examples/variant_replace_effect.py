"""A variant that replaces an effect: prefill's rejection keeps the prompt as a placeholder.

Run it:  kvhandoff check --variant examples/variant_replace_effect.py --engine all

The design starts from the reference (proved safe). The change: "rather than fail a prompt that
is over prefill's limit, keep the request going as a one-page placeholder" (SGLang's path, M1).
It is a change of *what* a step does, so it replaces the effect of `prefill_reject_request` and
keeps its guard. The checker answers with the run where the client gets output for a request
that was never prefilled as sent, and no error.

The effect is written as a formula (`spec.effects.effect`): updates over the state's vocabulary
(`spec/vocabulary.py`), every value read in the state before the step. Every engine reads it: the
explorer runs it, BMC and k-induction translate it in place of the rulebook's effect. The same
change as a Python function `(config, state, action) -> state` is
tests/data/python_variants/override_reject.py; only the explorer can run that one (the Z3 engines refuse
it, exit 3, naming it).
"""

from kvhandoff.spec.effects import assign, effect
from kvhandoff.spec.variants import REFERENCE
from kvhandoff.spec.vocabulary import not_as_is, p, p_gen, p_len

# The rulebook's rejection (reference design) fails closed: `p := rejected`, a failure notice to
# decode and an error to the client. This one keeps the request, one page long, and tells no one.
placeholder = effect(
    lambda r: [
        assign(not_as_is(r), True),
        assign(p(r), "admitted"),
        assign(p(r), "granted", when=p_gen(r) != 0),  # the grant may already be here
        assign(p_len(r), 1),
    ]
)

VARIANT = REFERENCE.derive(
    "placeholder_effect",
    "Prefill's rejection path keeps the request as a one-page placeholder (an effect formula).",
    breaks=("rejected_request_gets_error_not_output",),
    step_overrides={"prefill_reject_request": placeholder},
)
