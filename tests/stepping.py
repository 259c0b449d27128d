"""Taking one named step by hand, for tests that walk the spec (or a target in lockstep) through a
story: the action of a kind that is enabled, which must be the only one of its kind."""

from __future__ import annotations

from kvhandoff.conformance.lockstep import Session
from kvhandoff.conformance.validate import Ids
from kvhandoff.spec import Config, enabled, step
from kvhandoff.spec.actions import Action
from kvhandoff.spec.state import State
from kvhandoff.spec.variants import Variant


def take_one(variant: Variant, config: Config, state: State, kind: type) -> State:
    """Step the one enabled action of `kind` (there must be exactly one)."""
    options: list[Action] = [a for a in enabled(variant, config, state) if isinstance(a, kind)]
    assert len(options) == 1, (kind.__name__, options)
    return step(variant, config, state, options[0])


def take_in(session: Session, kind: type) -> bool:
    """Do the one enabled action of `kind` in a lockstep session; whether the target took it."""
    (action,) = [a for a in session.enabled() if isinstance(a, kind)]
    return session.do(action)


def log_ids(config: Config) -> Ids:
    """The request ids the targets give the scenario's requests (`r0`, `r1`, ...)."""
    return Ids(config.page_size, {f"r{r}": r for r in range(len(config.requests))})
