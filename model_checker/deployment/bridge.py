"""The bridge from a deployment to the protocol model (`spec.Config`, `kvhandoff check`).

The protocol model counts pages, not tokens, and must stay tiny to be checked exhaustively. So a
failing deployment is scaled: one model page stands for a band of B tokens, with B the longest
prompt below the first failing length. Then the shortest failing prompt needs 2 model pages while
everything the deployment handles safely fits in 1, and the roles' limits become small page counts:

    page_size          = B                          tokens per model page
    prefill_max_prompt = ceil(prefill serves whole / B)
    decode_max_prompt  = ceil(decode serves whole / B)
    context_window     = ceil((router window - 1) / B)
    prefill_pool_pages = prefill pool // B,  decode_pages = decode pool // B (at most 4, at least
                         what decode must reserve for the longer request)
    requests           = tenant a: 1 page (a normal prompt), tenant b: ceil(first failing
                         length / B) pages

A safe deployment is scaled so that the router's longest prompt is 2 pages, and the reference
protocol is checked on that shape.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from kvhandoff.model_checker.deployment.engines import role_limits
from kvhandoff.model_checker.deployment.findings import Finding, Severity
from kvhandoff.model_checker.deployment.model import Deployment, Role

MAX_MODEL_DECODE_PAGES = 4


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def boundary_finding(findings: Sequence[Finding]) -> Finding | None:
    """The length finding the protocol model should reproduce: a leak first, then any error with
    a length range that involves both roles, then a single role's (C1)."""
    errors = [f for f in findings if f.severity is Severity.ERROR and f.lengths is not None]
    errors.sort(key=lambda f: (not f.leak, len(f.roles) < 2, f.lengths.lo if f.lengths else 0))
    return errors[0] if errors else None


def to_protocol_config(deployment: Deployment, findings: Sequence[Finding]) -> dict[str, str]:
    """`--set` KEY=VALUE pairs for `kvhandoff check` (see the module docstring for the scale)."""
    d = deployment
    lim = {r: role_limits(d.role(r), d.version) for r in Role}
    p_full = lim[Role.PREFILL].largest_full_prompt
    d_full = lim[Role.DECODE].largest_full_prompt
    longest = d.router_window.value - 1
    found = boundary_finding(findings)
    if found is not None and found.lengths is not None:
        band = max(1, found.lengths.lo - 1)
        long_request = max(2, _ceil(found.lengths.lo, band))
    else:
        band = max(1, _ceil(longest, 2))
        long_request = _ceil(min(longest, p_full, d_full), band) if min(p_full, d_full) else 1
    decode_max = _ceil(d_full, band)
    decode_pages = min(MAX_MODEL_DECODE_PAGES, lim[Role.DECODE].pool_tokens // band)
    decode_pages = max(decode_pages, decode_max, long_request)
    return {
        "page_size": str(band),
        "context_window": str(_ceil(longest, band)),
        "prefill_max_prompt": str(_ceil(p_full, band)),
        "decode_max_prompt": str(decode_max),
        "prefill_pool_pages": str(max(1, lim[Role.PREFILL].pool_tokens // band)),
        "decode_pages": str(decode_pages),
        "requests": f"a:1:1,b:{long_request}:2",
    }


def protocol_variant(findings: Sequence[Finding]) -> str:
    """The incident variant shows what a leaking admission gap does to the handoff; anything else
    is checked against the reference protocol."""
    found = boundary_finding(findings)
    return "incident" if found is not None and found.leak else "reference"


def check_command(variant: str, pairs: Mapping[str, str]) -> str:
    sets = " ".join(f"--set {shlex.quote(f'{k}={v}')}" for k, v in pairs.items())
    return f"kvhandoff check --variant {variant} {sets}"


def build_spec_config(pairs: Mapping[str, str]) -> object | None:
    """A `spec.Config` for the pairs, if the spec package provides one that accepts them. The spec
    is written separately: its `parse_set` (the same parser `kvhandoff check --set` uses) applies
    the pairs to its default scenario, which keeps the fault bounds. Until the spec exists, or if
    it rejects the pairs, this returns None and the report still prints the command."""
    try:
        from kvhandoff import spec  # the protocol model; optional at this layer

        parse_set = getattr(spec, "parse_set", None)
        default_config = getattr(spec, "default_config", None)
        if parse_set is not None and default_config is not None:
            config: object = parse_set(default_config(), [f"{k}={v}" for k, v in pairs.items()])
            return config
        config_cls = getattr(spec, "Config", None)
        request_cls = getattr(spec, "RequestSpec", None)
        if config_cls is None or request_cls is None:
            return None
        requests = tuple(
            request_cls(tenant=t, pages=int(n), room=int(room))
            for t, n, room in (item.split(":") for item in pairs["requests"].split(","))
        )
        ints = {k: int(v) for k, v in pairs.items() if k != "requests"}
        config = config_cls(**ints, requests=requests)
        return config
    except (ImportError, TypeError, ValueError):
        return None
