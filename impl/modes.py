"""Implementation modes: the reference protocol and one mode per catalogued bug that applies.

The table below is the only place a mode is defined. Each mode is a `Behaviour` (named switches
that the protocol cores read) plus the M-numbers of `reference/engines.md` §7 it reproduces. The
names are the same as the spec's variants (`spec/variants.py`), and a mode means the same thing as
its variant: many bugs are harmless on their own against the reference's other defences, so the
variant flips the smallest set of options that makes its bug observable, and the mode flips the
same set (its M-numbers are the combination's). A conformance run can then pair them up: the
model checker's counterexample for a variant, replayed in the mode of the same name, shows the
bug (`tests/conformance/test_modes_are_caught.py`).

| mode | what it changes | M |
|---|---|---|
| reference | nothing: receiver-checked writes, completion with page count + digest checked before generating, explicit rejection, fenced release, scrubbed pages | - |
| incident | M1 + M2 + M3 + M20, and default limits in the incident's shape (context window > prefill pool, decode admits more than prefill: M6's asymmetric admission, without truncation) | 1, 2, 3, 6, 20 |
| m1_placeholder_rejection | prefill swaps an over-limit prompt for a 1-token placeholder and carries on (writes its page, sends an honest completion); no rejection notice | 1 |
| m2_local_completion_count | prefill truncates an over-limit prompt (M6), writes the pages of its own view and claims the whole grant (M2); decode checks the page count only | 2, 6 |
| m3_decode_trusts_completion | decode checks only the completion's room (M3); the placeholder path (M1) is the source of the gap | 3, 1 |
| m5_digest_skipped | prefill truncates (M6) and claims the whole grant (M2) in a completion without a digest; decode checks the digest only when one came (M5) | 5, 2, 6 |
| m6_asymmetric_truncation | prefill silently truncates an over-limit prompt instead of rejecting, and writes what it kept | 6 |
| m7_release_before_drain | decode frees pages on abort/timeout at once and lets writes of released generations land | 7 |
| m8_release_on_timeout | decode waits for the drain ack but frees on a timeout without it; late writes land | 8 |
| m10_stale_status_adopted | decode finds a completion by room only, ignoring generation and token | 10 |
| m15_silent_prefill_abort | a prefill-side abort (failed write stream, local abort, router cancel) is told to nobody but the client: no notice to decode, no relay by the router, a later grant acked and dropped | 15 |
| m16_router_ignores_prefill_error | router answers with decode's result, ignoring prefill's error | 16 |
| m18_orphan_grant_accepted | prefill keeps transfer state for grants it never admitted, forever, matched by room | 18 |
| m20_unscrubbed_pages | released pages keep their data | 20 |

M13 and M14 are not implemented: see `NOT_APPLICABLE`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvhandoff.impl.errors import ConfigError


@dataclass(frozen=True)
class Behaviour:
    """Switches read by the protocol cores; all False/True-as-reference by default."""

    # M1 (prefill): an over-limit prompt becomes a 1-token placeholder that bootstraps normally.
    placeholder_rejection: bool = False
    # M2 (prefill): after the pages of its own view, the completion claims the whole grant.
    local_completion_count: bool = False
    decode_trusts_completion: bool = False  # M3 (decode): nothing but the room is checked
    # Decode checks the completion's page count only: no coverage, no digest (the spec's
    # `validation="count_only"`, what m2 needs to be observable).
    count_only_validation: bool = False
    omit_completion_digest: bool = False  # M5 (prefill): the completion carries no digest
    digest_optional: bool = False  # M5 (decode): coverage and digest checked only if one came
    truncate_oversized: bool = False  # M6 (prefill)
    release_before_drain: bool = False  # M7 (decode)
    release_on_ack_timeout: bool = False  # M8 (decode)
    late_writes_land: bool = False  # M7, M8 (decode): writes of released generations are stored
    match_completion_by_room: bool = False  # M10 (decode)
    # M15 (prefill and router): a prefill-side abort reaches the client only; decode is told
    # nothing (no notice, no relay by the router, a later grant acked and dropped).
    silent_prefill_abort: bool = False
    router_ignores_prefill_error: bool = False  # M16 (router)
    accept_orphan_grants: bool = False  # M18 (prefill)
    scrub_on_release: bool = True  # False = M20 (decode)
    incident_shaped_limits: bool = False  # incident: default limits reproduce the incident


@dataclass(frozen=True)
class Mode:
    name: str
    summary: str
    m_numbers: tuple[int, ...]
    behaviour: Behaviour


_TABLE: tuple[Mode, ...] = (
    Mode(
        "reference",
        "receiver-checked writes, completion (page count + digest) validated before generating, "
        "explicit rejection, fenced release, scrubbed pages",
        (),
        Behaviour(),
    ),
    Mode(
        "incident",
        "placeholder rejection, sender-local completion count, decode trusts the signal, "
        "asymmetric pools, unscrubbed pages",
        (1, 2, 3, 6, 20),
        Behaviour(
            placeholder_rejection=True,
            local_completion_count=True,
            decode_trusts_completion=True,
            scrub_on_release=False,
            incident_shaped_limits=True,
        ),
    ),
    Mode(
        "m1_placeholder_rejection",
        "prefill swaps an over-limit prompt for a 1-token placeholder, no rejection notice",
        (1,),
        Behaviour(placeholder_rejection=True),
    ),
    Mode(
        "m2_local_completion_count",
        "prefill truncates an over-limit prompt, writes its own view's pages and claims the whole "
        "grant; decode checks the page count only",
        (2, 6),
        Behaviour(truncate_oversized=True, local_completion_count=True, count_only_validation=True),
    ),
    Mode(
        "m3_decode_trusts_completion",
        "decode checks only the completion's room (no generation, token, coverage or digest); "
        "the placeholder path leaves the gap it trusts",
        (3, 1),
        Behaviour(placeholder_rejection=True, decode_trusts_completion=True),
    ),
    Mode(
        "m5_digest_skipped",
        "prefill truncates and claims the whole grant in a completion without a digest; decode "
        "checks coverage and digest only when a digest came",
        (5, 2, 6),
        Behaviour(
            truncate_oversized=True,
            local_completion_count=True,
            omit_completion_digest=True,
            digest_optional=True,
        ),
    ),
    Mode(
        "m6_asymmetric_truncation",
        "prefill silently truncates an over-limit prompt instead of rejecting it",
        (6,),
        Behaviour(truncate_oversized=True),
    ),
    Mode(
        "m7_release_before_drain",
        "decode frees pages on abort/timeout while writes are in flight; late writes land",
        (7,),
        Behaviour(release_before_drain=True, late_writes_land=True),
    ),
    Mode(
        "m8_release_on_timeout",
        "decode frees pages when the drain ack times out, without the ack; late writes land",
        (8,),
        Behaviour(release_on_ack_timeout=True, late_writes_land=True),
    ),
    Mode(
        "m10_stale_status_adopted",
        "decode matches completions by room only, adopting one from an earlier incarnation",
        (10,),
        Behaviour(match_completion_by_room=True),
    ),
    Mode(
        "m15_silent_prefill_abort",
        "a prefill-side abort is told to the client only: decode holds the pages until its "
        "waiting timeout",
        (15,),
        Behaviour(silent_prefill_abort=True),
    ),
    Mode(
        "m16_router_ignores_prefill_error",
        "router returns decode's answer and ignores prefill's error",
        (16,),
        Behaviour(router_ignores_prefill_error=True),
    ),
    Mode(
        "m18_orphan_grant_accepted",
        "prefill keeps transfer state for grants of rooms it never admitted and never cleans it",
        (18,),
        Behaviour(accept_orphan_grants=True),
    ),
    Mode(
        "m20_unscrubbed_pages",
        "pages are freed without scrubbing",
        (20,),
        Behaviour(scrub_on_release=False),
    ),
)

MODES: dict[str, Mode] = {m.name: m for m in _TABLE}

NOT_APPLICABLE: dict[str, str] = {
    "m13_lease_expiry_pull": (
        "vLLM pull design: decode reads pages that prefill pins under a lease. Here prefill pushes "
        "into pages decode owns and decode checks every write, so there is no producer lease to expire."
    ),
    "m14_silent_receive_failure_pull": (
        "vLLM pull design: a failed READ is not reported. Here a failed or missing write shows up "
        "as missing coverage at completion, which the reference refuses (and m3/m5 reproduce the "
        "trusting decode)."
    ),
}


def get_mode(name: str) -> Mode:
    """The mode called ``name``; ConfigError listing every mode otherwise."""
    try:
        return MODES[name]
    except KeyError:
        hint = NOT_APPLICABLE.get(name)
        extra = f" ({name} is not applicable: {hint})" if hint else ""
        raise ConfigError(f"unknown mode {name!r}{extra}; modes: {', '.join(MODES)}") from None
