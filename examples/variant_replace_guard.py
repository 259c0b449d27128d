"""A variant that replaces a guard: decode stops waiting for prefill's drain ack before release.

Run it:  kvhandoff check --variant examples/variant_replace_guard.py

The design starts from `one_sided_fenced` (one-sided writes, which decode cannot refuse, fenced by
prefill's drain ack after an abort; proved safe). The change: "the ack is slow; once we have
aborted, release the pages straight away". It is a change of *when* a step may happen, so it
replaces the guard of `decode_release_pages` and keeps its effect. The checker answers with the
run where an aborted request's write, still in flight, lands in a page granted to the next request
(M7, sglang #24527), and, further on, the next request generating from that other tenant's data.
A Z3 engine cannot translate Python code and says so (exit 3).
"""

from spec.actions import DecodeReleasePages
from spec.config import Config
from spec.state import State
from spec.variants import get_variant


def release_without_waiting(config: Config, state: State) -> list[DecodeReleasePages]:
    # The rulebook's guard also asks `not req.d_awaiting_ack`: that clause is the fence.
    return [
        DecodeReleasePages(r)
        for r, req in enumerate(state.requests)
        if req.d in ("answered", "failed") and req.d_pages
    ]


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
