"""A variant that adds an action: a page-pool warmer that fills free decode pages.

Run it:  kvhandoff check --variant tests/kvhandoff_cli/variant_added_action.py

The added action is a frozen dataclass like the spec's own; `extra_actions` says when it is
enabled, `step_overrides` (under its snake_case name) what it does, and `extra_action_types`
lists its class so that a trace of this variant reads back (`kvhandoff explain`).
"""

from dataclasses import dataclass, replace

from kvhandoff.spec.config import Config
from kvhandoff.spec.state import OTHER_TENANT, State, Tag
from kvhandoff.spec.variants import REFERENCE


@dataclass(frozen=True)
class DecodeWarmPage:
    """A warmer copies another tenant's KV into a free page, hoping it is reused as a prefix."""

    page: int


def warmable(config: Config, state: State) -> list[DecodeWarmPage]:
    return [
        DecodeWarmPage(i)
        for i, page in enumerate(state.pages)
        if page.owner is None and page.content is None
    ]


def warm(config: Config, state: State, action: DecodeWarmPage) -> State:
    page = replace(state.pages[action.page], content=Tag(-1, 0, OTHER_TENANT))
    pages = (*state.pages[: action.page], page, *state.pages[action.page + 1 :])
    return replace(state, pages=pages)


VARIANT = replace(
    REFERENCE.derive(
        "warm_free_pages",
        "Decode fills free pages with another tenant's KV (an added action).",
        breaks=("freed_pages_hold_no_readable_data",),
    ),
    extra_actions=warmable,
    step_overrides={"decode_warm_page": warm},
    extra_action_types=(DecodeWarmPage,),
)
