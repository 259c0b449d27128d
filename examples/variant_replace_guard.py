"""A variant that replaces a guard: decode stops waiting for prefill's drain ack before release.

Run it:  kvhandoff check --variant examples/variant_replace_guard.py --engine all

The design starts from `one_sided_fenced` (one-sided writes, which decode cannot refuse, fenced by
prefill's drain ack after an abort; proved safe). The change: "the ack is slow; once we have
aborted, release the pages straight away". It is a change of *when* a step may happen, so it
replaces the guard of `decode_release_pages` and keeps its effect. The checker answers with the
run where an aborted request's write, still in flight, lands in a page granted to the next request
(M7, sglang #24527), and, further on, the next request generating from that other tenant's data.

The guard is written as a formula (`spec.logic.guard`) over the state's vocabulary
(`spec/vocabulary.py`), so every engine reads it: the explorer compiles it, BMC and k-induction
put it in place of the rulebook's guard in their encoding. The same guard as a Python function
`(config, state) -> [DecodeReleasePages(r), ...]` works too, but only the explorer can run that
(the Z3 engines refuse it, exit 3, naming it).
"""

from kvhandoff.spec.logic import PAGE, And, exists, guard
from kvhandoff.spec.variants import get_variant
from kvhandoff.spec.vocabulary import d, d_holds

# The rulebook's guard is `d in (answered, failed) and some page held and not d_awaiting_ack`:
# the last clause is the fence this change drops.
release_without_waiting = guard(
    lambda r: And(d(r).is_in("answered", "failed"), exists(PAGE, lambda q: d_holds(r, q)))
)

VARIANT = get_variant("one_sided_fenced").derive(
    "release_without_drain_ack",
    "Decode releases an aborted request's pages without waiting for prefill's drain ack.",
    breaks=(
        "no_late_write_lands_in_reallocated_page",
        "freed_pages_hold_no_readable_data",
        "decode_reads_only_validated_pages",
        "no_cross_tenant_read",
    ),
    guard_overrides={"decode_release_pages": release_without_waiting},
)
