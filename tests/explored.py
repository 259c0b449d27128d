"""Explorer results shared across test modules (each variant is explored once per session)."""

from __future__ import annotations

from functools import cache

from kvhandoff.model_checker.explore import explore
from kvhandoff.model_checker.result import CheckResult
from kvhandoff.spec import Config, get_variant

SMALL = [
    "requests=a:1:1,b:2:2",
    "decode_pages=2",
    "prefill_max_prompt=1",
    "decode_max_prompt=2",
    "context_window=2",
]
"""`--set` values of the small scenario (two requests, two pages) several test modules explore."""


@cache
def explored(variant_name: str) -> CheckResult:
    """The variant explored on its catalogue scenario (the default config, plus its `config`)."""
    variant = get_variant(variant_name)
    return explore(variant, variant.scenario(Config()))
