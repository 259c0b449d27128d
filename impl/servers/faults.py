"""Network faults on the control messages between prefill and decode, for fault campaigns.

Off unless a test or a campaign installs a `FaultPlan` (`Cluster.set_faults`); production
servers never have one. The faults are the spec's network faults, made real at the sender:

* **late**: the message waits a random while before it is sent (so messages of different
  requests, and of the two directions, reorder);
* **dup**: the message is sent twice (the second copy's answer is ignored): every receiver must
  treat a duplicate as a no-op;
* **drop**: the message is lost and its sender is not told. Only for the messages whose sender
  repeats them until answered (decode's abort, prefill's abort ack answering each abort): a lost
  grant, write or completion is a broken call in gRPC, which the sender does see.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

KINDS = ("grant", "abort", "abort_ack", "rejection", "completion")
DROPPABLE = frozenset({"abort", "abort_ack"})


@dataclass
class FaultPlan:
    late: float = 0.0  # probability that a message is delayed
    max_delay_s: float = 0.03
    dup: float = 0.0
    drop: float = 0.0
    seed: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0  # control messages being sent through the plan (a campaign waits for 0)
    _rng: random.Random = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def reseed(self, seed: int) -> None:
        with self._lock:
            self._rng = random.Random(seed)

    def _hit(self, p: float, what: str) -> bool:
        with self._lock:
            if p <= 0 or self._rng.random() >= p:
                return False
            self.counts[what] = self.counts.get(what, 0) + 1
            return True

    def delay(self, kind: str) -> float:
        if not self._hit(self.late, f"late_{kind}"):
            return 0.0
        with self._lock:
            return self._rng.uniform(0.0, self.max_delay_s)

    def duplicate(self, kind: str) -> bool:
        return self._hit(self.dup, f"dup_{kind}")

    def lose(self, kind: str) -> bool:
        return kind in DROPPABLE and self._hit(self.drop, f"drop_{kind}")
