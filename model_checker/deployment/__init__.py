"""Deploy-time capacity and configuration checker for disaggregated SGLang and vLLM deployments.

Reads the prefill and decode servers' launch command lines (or a neutral TOML file), derives each
engine's admission limits from its flags (engines.md §5), and lets Z3 decide whether every prompt
the router admits is handled identically by prefill and decode and fits both pools; if not, it
reports the smallest and largest failing prompt lengths and the rule they break.

Pipeline: `build` (inputs → `Deployment`) → `decide` (Z3 + `rules`) → `report` (text / JSON), with
`bridge` scaling a failing deployment into the protocol model's `Config`. Errors: see `errors`.
"""

from kvhandoff.model_checker.deployment.build import CheckerOptions, from_commands, from_toml
from kvhandoff.model_checker.deployment.decision import Decision, decide
from kvhandoff.model_checker.deployment.errors import (
    ConfigInputError,
    DeploymentError,
    InconclusiveError,
)
from kvhandoff.model_checker.deployment.findings import Finding, LengthRange, Severity

__all__ = [
    "CheckerOptions",
    "ConfigInputError",
    "Decision",
    "DeploymentError",
    "Finding",
    "InconclusiveError",
    "LengthRange",
    "Severity",
    "decide",
    "from_commands",
    "from_toml",
]
