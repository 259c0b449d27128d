"""The prefill->decode KV-cache handoff, as an executable state machine.

This package is the single source of truth of kvhandoff. Every other part takes its meaning from it:
the explicit-state and Z3 model checkers explore it, the conformance suite uses it as an oracle for a
running implementation, and the trace validator explains event logs with it.

It is written to be read. Start with `config.py` (what a scenario is), then `state.py` (what the
system remembers, including the *ghost* fields that only the properties read), `actions.py` (every
step anyone can take, faults included), `machine.py` (what each step does), `properties.py` (what
must always hold and what must be possible), and `variants.py` (the reference protocol, the incident
and the catalogue of real bugs, each as a small set of flipped design options).

Rules this package keeps (a test enforces the imports):
- pure: no I/O, no clock, no randomness, no logging; it imports nothing but the standard library;
- states and actions are frozen, hashable dataclasses;
- `enabled(variant, config, state)` returns actions in a stable order: protocol steps first,
  faults last; `step(variant, config, state, action)` is the only place state changes.
"""

from kvhandoff.spec.actions import (
    FAULT_ACTIONS,
    Action,
    action_from_json,
    action_name,
    action_to_json,
)
from kvhandoff.spec.config import Config, ConfigError, RequestSpec, default_config, parse_set
from kvhandoff.spec.machine import enabled, init, step
from kvhandoff.spec.properties import (
    ALWAYS,
    DEPLOYMENT,
    SOMETIMES,
    Property,
    PropertyViolation,
    check_always,
)
from kvhandoff.spec.state import Message, PageState, ReqState, State, Tag, Write
from kvhandoff.spec.variants import REFERENCE, VARIANTS, Design, Variant, get_variant

__all__ = [
    "ALWAYS",
    "DEPLOYMENT",
    "FAULT_ACTIONS",
    "REFERENCE",
    "SOMETIMES",
    "VARIANTS",
    "Action",
    "Config",
    "ConfigError",
    "Design",
    "Message",
    "PageState",
    "Property",
    "PropertyViolation",
    "ReqState",
    "RequestSpec",
    "State",
    "Tag",
    "Variant",
    "Write",
    "action_from_json",
    "action_name",
    "action_to_json",
    "check_always",
    "default_config",
    "enabled",
    "get_variant",
    "init",
    "parse_set",
    "step",
]
