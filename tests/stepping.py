"""Taking one named step by hand, for tests that walk the spec (or a target in lockstep) through a
story: the action of a kind that is enabled, which must be the only one of its kind; and the
stages and random programs several fault stories share."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

from kvhandoff.conformance.inproc import InProcTarget
from kvhandoff.conformance.lockstep import Session, run_program
from kvhandoff.conformance.validate import Ids, Validator
from kvhandoff.spec import Config, enabled, init, step
from kvhandoff.spec.actions import Action, action_name
from kvhandoff.spec.config import RequestSpec
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


def one_fault_config(**budgets: int) -> Config:
    """One request of one page, one fault in the run, and only the kinds of fault `budgets`
    allows (`max_partitions=1`, ...): the smallest stage for one fault's story."""
    quiet = dict.fromkeys(
        (
            "max_crashes",
            "max_drops",
            "max_duplicates",
            "max_timeouts",
            "max_cancels",
            "max_prefill_aborts",
        ),
        0,
    )
    return Config(
        decode_pages=1,
        requests=(RequestSpec("a", 1, 1),),
        max_faults=1,
        **{**quiet, **budgets},
    )


def walk(variant: Variant, config: Config, kinds: Iterable[type]) -> State:
    """From the initial state, the one enabled action of each kind in turn."""
    state = init(config)
    for kind in kinds:
        state = take_one(variant, config, state, kind)
    return state


def biased_programs(config: Config, bias: Sequence[tuple[type, float]], counted: str) -> list[int]:
    """150 random programs of 20 steps, in process against the reference: at each step, the
    first enabled action of each kind in `bias`, in order, is taken with its probability, and
    otherwise one action at random (a fault drawn uniformly is rare). Every program's log must
    validate. How many times each program performed the action named `counted`."""
    counts = []
    for seed in range(150):
        rnd = random.Random(seed)

        def choose(options: list[Action], rnd: random.Random = rnd) -> Action:
            for kind, chance in bias:
                found = [a for a in options if isinstance(a, kind)]
                if found and rnd.random() < chance:
                    return found[0]
            return rnd.choice(options)

        session = run_program(InProcTarget(), config, "reference", choose, 20)
        counts.append(
            sum(1 for s in session.steps if s.performed and action_name(s.action) == counted)
        )
        report = Validator(config, log_ids(config)).run(session.events)
        assert report.ok, (seed, report.message)
    return counts
