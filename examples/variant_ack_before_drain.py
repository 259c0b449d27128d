"""A variant that replaces the guard of a step each prefill rank takes: the drain ack is sent early.

Run it:  kvhandoff check --variant examples/variant_ack_before_drain.py --engine all

The design starts from `one_sided_fenced` (one-sided writes, which decode cannot refuse, fenced by
prefill's drain ack after an abort; proved safe). The change: "acknowledge the abort as soon as
it arrives; the writes already posted will finish soon anyway". It is a change of *when* prefill
may acknowledge, so it replaces the guard of `prefill_send_abort_ack` and keeps its effect. The
ack is then a promise prefill cannot keep: decode releases the pages while a write of the aborted
generation is still on the wire, and the write lands in a page granted to the next request (the
use-after-free that SGLang's deferred release was written to prevent, M7/M8).

The rulebook's guard is a `rank_guard`: enabled for each drain ack owed, named by the request
that owes it (`r`) and the prefill rank (`k`). A replacement must range over the same arguments
(a variant that wrote `guard(lambda r: ...)` here is refused, naming the form to use), so every
engine binds them alike: the explorer compiles it, BMC and k-induction translate it.
"""

from kvhandoff.spec.logic import And, Not, rank_guard
from kvhandoff.spec.variants import get_variant
from kvhandoff.spec.vocabulary import p_acked, pending_ack

# The rulebook's guard also asks that no write of rank k under the aborted grant is in flight
# (`each_write(...)`): the clause this change drops.
ack_at_once = rank_guard(lambda r, k: And(pending_ack(r), Not(p_acked(r, k))))

VARIANT = get_variant("one_sided_fenced").derive(
    "ack_before_drain",
    "Prefill acknowledges an abort before its writes of the aborted grant have drained.",
    breaks=(
        "no_late_write_lands_in_reallocated_page",
        "freed_pages_hold_no_readable_data",
        "decode_reads_only_validated_pages",
        "no_cross_tenant_read",
    ),
    guard_overrides={"prefill_send_abort_ack": ack_at_once},
)
