"""A variant that replaces what a fault does: decode's waiting timeout frees the pages at once.

Run it:  kvhandoff check --variant examples/variant_replace_fault.py --engine all

The design starts from `one_sided_fenced` (one-sided writes, fenced by prefill's drain ack after
an abort; proved safe). The change: "when decode gives up waiting for prefill, answer the client
with an error and put the pages straight back in the pool". In the rulebook the timeout fails the
request like any other give-up: it sends prefill an abort and, on this design, holds the pages
until prefill's drain ack. Here nothing tells prefill, and nothing fences the pages: the write
prefill still has in flight lands in a page decode has since granted to another request (M8's
timeout path, SGLang PR #38961: "the timeout path ... is itself a use-after-free window").

Faults are ordinary actions, so a variant replaces one as it replaces a protocol step: here the
effect (`effect(lambda r: ...)`, the fault's request). A fault's effect must spend its budget
(`timeouts_spent` here), as the rulebook's does, or a run could take it for ever: a variant that
forgets is refused, naming the counts. A replaced fault *guard* keeps the run's total fault budget
whatever it says.
"""

from kvhandoff.spec.effects import answer_error, assign, each, effect
from kvhandoff.spec.logic import PAGE, RANK
from kvhandoff.spec.variants import get_variant
from kvhandoff.spec.vocabulary import d, d_holds, owned, shard_has, timeouts_spent

free_at_once = effect(
    lambda r: [
        assign(timeouts_spent(), timeouts_spent() + 1),
        answer_error(r, "timed out waiting for prefill"),
        assign(d(r), "released"),
        each(
            PAGE,
            lambda q: [
                assign(owned(q), False, when=d_holds(r, q)),
                # Scrubbed, as the rulebook's release does: the bug is the missing fence.
                each(RANK, lambda k: assign(shard_has(q, k), False, when=d_holds(r, q))),
                assign(d_holds(r, q), False),
            ],
        ),
    ]
)

VARIANT = get_variant("one_sided_fenced").derive(
    "timeout_frees_at_once",
    "Decode's waiting timeout answers an error and frees the pages, telling prefill nothing.",
    breaks=(
        "no_late_write_lands_in_reallocated_page",
        "freed_pages_hold_no_readable_data",
        "decode_reads_only_validated_pages",
        "no_cross_tenant_read",
    ),
    step_overrides={"decode_waiting_timeout": free_at_once},
)
