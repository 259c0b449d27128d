"""Implementation modes: the reference protocol and one mode per catalogued bug that applies.

The table below is the only place a mode is defined. Each mode is a `Behaviour` (named switches
that the protocol cores read) plus the M-numbers of `reference/engines.md` §7 it reproduces. The
names are the same as the spec's variants so a conformance run can pair them up.

| mode | what it changes | M |
|---|---|---|
| reference | nothing: receiver-checked writes, completion with page count + digest checked before generating, explicit rejection, fenced release, scrubbed pages | - |
| incident | M1 + M2 + M3 + M20, and default limits in the incident's shape (context window > prefill pool, decode admits more than prefill: M6's asymmetric admission, without truncation) | 1, 2, 3, 6, 20 |
| m1_placeholder_rejection | prefill swaps an over-limit prompt for a 1-token placeholder and carries on; no rejection notice | 1 |
| m2_local_completion_count | prefill writes and declares done for its own view of the prompt length, not the grant | 2 |
| m3_decode_trusts_completion | decode checks only that the completion's room matches | 3 |
| m5_digest_skipped | decode checks the claimed page count only; no per-page or completion digest, no coverage record | 5 |
| m6_asymmetric_truncation | prefill silently truncates an over-limit prompt instead of rejecting | 6 |
| m7_release_before_drain | decode frees pages on abort/timeout at once and lets writes of released generations land | 7 |
| m8_release_on_timeout | decode waits for the drain ack but frees on a timeout without it; late writes land | 8 |
| m10_stale_status_adopted | decode finds a completion by room only, ignoring generation and token | 10 |
| m15_silent_prefill_abort | a prefill-side abort (cancel, failed write) is not told to decode | 15 |
| m16_router_ignores_prefill_error | router answers with decode's result, ignoring prefill's error | 16 |
| m18_orphan_grant_accepted | prefill keeps transfer state for grants it never admitted, forever, matched by room | 18 |
| m20_unscrubbed_pages | released pages keep their data | 20 |

M13 and M14 are not implemented: see `NOT_APPLICABLE`.
"""

from __future__ import annotations

from dataclasses import dataclass

from impl.errors import ConfigError


@dataclass(frozen=True)
class Behaviour:
    """Switches read by the protocol cores; all False/True-as-reference by default."""

    placeholder_rejection: bool = False  # M1 (prefill)
    local_completion_count: bool = False  # M2 (prefill)
    decode_trusts_completion: bool = False  # M3 (decode)
    skip_digest: bool = False  # M5 (decode)
    truncate_oversized: bool = False  # M6 (prefill)
    release_before_drain: bool = False  # M7 (decode)
    release_on_ack_timeout: bool = False  # M8 (decode)
    late_writes_land: bool = False  # M7, M8 (decode): writes of released generations are stored
    match_completion_by_room: bool = False  # M10 (decode)
    silent_prefill_abort: bool = False  # M15 (prefill)
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
        "prefill declares done after writing the pages of its own view of the prompt",
        (2,),
        Behaviour(local_completion_count=True),
    ),
    Mode(
        "m3_decode_trusts_completion",
        "decode checks only the completion's room: no generation, token, coverage or digest",
        (3,),
        Behaviour(decode_trusts_completion=True),
    ),
    Mode(
        "m5_digest_skipped",
        "decode checks the claimed page count but no digest and no per-page coverage",
        (5,),
        Behaviour(skip_digest=True),
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
        "a prefill-side abort is not told to decode, which holds pages until its timeout",
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
