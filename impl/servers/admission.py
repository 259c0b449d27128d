"""Admission queue: requests that cannot start yet wait here instead of being refused.

Used at two edges (the protocol cores never see a queued request, so no protocol step and no
log line changes):

* decode: a request whose pages are not free waits until a release frees enough of them;
* the router: a request over the in-flight bound waits until one in flight finishes.

Rules:

* **Bounded length.** Past ``max_len`` waiting requests, a new one is not queued: the caller
  refuses it at once (RESOURCE_EXHAUSTED, saying the queue is full).
* **Per-request deadline.** An entry that waited ``timeout_s`` leaves the queue and the caller
  decides (decode hands it to its core, which refuses it naming the free pages).
* **Fair across tenants.** One FIFO per tenant, served round-robin: the next request admitted is
  the head of the next tenant in turn, so one tenant's burst cannot starve another's requests.
  The head that is not admissible blocks the queue (no overtaking by smaller requests): a large
  request cannot be starved by a stream of small ones.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(eq=False)
class Entry(Generic[T]):
    tenant: str
    item: T
    enqueued: float
    deadline: float
    held: bool = False  # waits for an outside event (not admitted by `pop_admissible`)
    removed: bool = field(default=False, repr=False)


class AdmissionQueue(Generic[T]):
    def __init__(self, max_len: int, timeout_s: float) -> None:
        self.max_len = max_len
        self.timeout_s = timeout_s
        self._tenants: OrderedDict[str, deque[Entry[T]]] = OrderedDict()  # order = turn
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Entry[T]]:
        for q in self._tenants.values():
            yield from q

    def push(self, tenant: str, item: T, now: float, *, held: bool = False) -> Entry[T] | None:
        """Queue ``item``; None when the queue is full."""
        if self._len >= self.max_len:
            return None
        entry = Entry(tenant, item, now, now + self.timeout_s, held)
        self._tenants.setdefault(tenant, deque()).append(entry)
        self._len += 1
        return entry

    def remove(self, entry: Entry[T]) -> bool:
        """Take ``entry`` out wherever it is; False when it already left."""
        q = self._tenants.get(entry.tenant)
        if entry.removed or q is None:
            return False
        q.remove(entry)
        entry.removed = True
        self._len -= 1
        if not q:
            del self._tenants[entry.tenant]
        return True

    def pop_admissible(self, admissible: Callable[[T], bool]) -> Entry[T] | None:
        """The head of the next tenant in turn, if it is admissible now (held entries are
        skipped: they are not waiting for capacity). The tenant then goes to the back."""
        for tenant in list(self._tenants):
            q = self._tenants[tenant]
            head = next((e for e in q if not e.held), None)
            if head is None:
                continue
            if not admissible(head.item):
                return None
            self.remove(head)
            if tenant in self._tenants:
                self._tenants.move_to_end(tenant)
            return head
        return None

    def expired(self, now: float) -> list[Entry[T]]:
        """Entries past their deadline, taken out of the queue."""
        out = [e for e in self if now >= e.deadline]
        for e in out:
            self.remove(e)
        return out
