"""Decode's pages under relabelling, and why the explorer does not reduce by it.

A *page permutation* renames decode's physical pages: page q becomes page `perm[q]`. It is the
natural candidate for symmetry reduction, since nothing in the properties, the invariants or the
vocabulary names a particular page. But the rulebook is **not** symmetric in its pages: two rules
read their order (`o < q` over `PAGE` in `spec/machine.py`):

* `decode_reserve_pages` grants the *lowest-numbered* free pages, and
* `prefill_write_page` writes a grant's pages in page order (`p_written` is the first `p_wrote`
  pages of the grant, in that order).

So a state and its image under a permutation need not behave alike. Free pages are not all alike
(a freed page keeps its ghost `last_tenant`; an unscrubbed one keeps its data; a late write may
still be on its way to one), and which of them the lowest-first rule picks, or which granted
page is written first while a stale write targets one of them, differs between the two. For
example, in the reference on the sequential scenario, two reachable states that differ only in
which of the two pages of request 2's grant a stale write of request 0 is heading for have
successors that are no relabelling of each other: prefill writes page 0 first in both, so in one
the new write and the stale one target the same page, in the other different pages
(tests/spec/test_page_symmetry.py replays them). The classes of states equal up to page
permutation are therefore no bisimulation, and a search that kept one state per class could miss
behaviour. The explorer does not offer the reduction; `benchmarks/page_symmetry.py` measures what
it could have gained (about a tenth of the states on the sequential scenario: the lowest-first rule
already breaks most of the symmetry) and how many classes disagree.

`permute_pages` is a group action on states (relabelling by one permutation and then by another is
relabelling by the two composed), and `canonical_pages` picks the least image of a state over every
permutation (least by `repr`): a true canonical form of the orbit, two states equal up to page
permutation map to the same representative, and each state maps to one of its own images. What
follows the relabelling, field by field:

* `State.pages`, reordered; `Write.page`, renamed;
* the page sets `ReqState.p_pages`, `ReqState.d_pages` and `Message.pages`, renamed and sorted
  again (they are sets kept sorted, see `spec/state.py`); `Message.digest`'s (page, request,
  generation) triples, renamed and sorted;
* `ReqState.read` and the `Answer.tags` made from it, which hold what decode read page by page in
  `d_pages` order: while decode still holds the pages, moved with them. Once the pages are
  released the sequence names no page any more and is kept as it is.

Nothing else in a state names a page: rooms, generations, requests, epochs and the ghost flags do
not. A variant's own state fields (`State.variant_fields`) might, and this module cannot know:
`permute_pages` refuses a state that has any.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import permutations

from kvhandoff.spec.state import Answer, Message, ReqState, State, Tag, Write, evolve

MAX_PAGES = 5
"""`canonical_pages` tries every permutation: at most 5! = 120 of them."""


class PageSymmetryError(ValueError):
    """A state this module cannot relabel: variant fields it cannot see into, or too many pages."""


def permute_pages(state: State, perm: Sequence[int]) -> State:
    """The state with page q renamed `perm[q]` everywhere it is named (see the module docstring)."""
    n = len(state.pages)
    if sorted(perm) != list(range(n)):
        raise PageSymmetryError(f"{list(perm)} is not a permutation of the {n} pages")
    if state.variant_fields:
        names = ", ".join(name for name, _ in state.variant_fields)
        raise PageSymmetryError(
            f"the state holds variant fields ({names}): whether they name pages is unknown"
        )
    pages = [state.pages[0]] * n
    for q, page in enumerate(state.pages):
        pages[perm[q]] = page
    return evolve(
        state,
        requests=tuple(_permute_request(r, perm) for r in state.requests),
        pages=tuple(pages),
        network=tuple(sorted(_permute_message(m, perm) for m in state.network)),
        lost=tuple(sorted(_permute_message(m, perm) for m in state.lost)),
        writes=tuple(sorted(_permute_write(w, perm) for w in state.writes)),
    )


def canonical_pages(state: State) -> State:
    """The least image of `state` under every page permutation (by `repr`): equal for two states
    exactly when one is a page permutation of the other."""
    n = len(state.pages)
    if n > MAX_PAGES:
        raise PageSymmetryError(f"{n} pages: canonical_pages tries all {n}! permutations")
    images = (permute_pages(state, perm) for perm in permutations(range(n)))
    return min(images, key=repr)


def _permute_request(req: ReqState, perm: Sequence[int]) -> ReqState:
    if not req.p_pages and not req.d_pages:
        return req
    changes: dict[str, object] = {"p_pages": tuple(sorted(perm[q] for q in req.p_pages))}
    if req.d_pages:
        # Decode's pages are a sorted set; what it read is a sequence in that order, one entry
        # per rank for each page, so the sequence is moved in blocks along with its pages.
        order = sorted(range(len(req.d_pages)), key=lambda i: perm[req.d_pages[i]])
        changes["d_pages"] = tuple(perm[req.d_pages[i]] for i in order)
        if req.read is not None:
            read = _reorder(req.read, order)
            changes["read"] = read
            if req.answer is not None and req.answer.ok and req.answer.tags == req.read:
                changes["answer"] = Answer(ok=True, tags=read)
    return evolve(req, **changes)


def _reorder(read: tuple[Tag | None, ...], order: list[int]) -> tuple[Tag | None, ...]:
    ranks = len(read) // len(order)
    return tuple(tag for i in order for tag in read[i * ranks : (i + 1) * ranks])


def _permute_message(m: Message, perm: Sequence[int]) -> Message:
    if not m.pages and not m.digest:
        return m
    digest = m.digest
    if digest is not None:
        digest = tuple(sorted((perm[q], r, g) for q, r, g in digest))
    return evolve(m, pages=tuple(sorted(perm[q] for q in m.pages)), digest=digest)


def _permute_write(w: Write, perm: Sequence[int]) -> Write:
    return evolve(w, page=perm[w.page])


__all__ = ["MAX_PAGES", "PageSymmetryError", "canonical_pages", "permute_pages"]
