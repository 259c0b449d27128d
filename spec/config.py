"""What a scenario is: the deployment's limits, the requests to play, and the fault budget.

Lengths in the model are counted in *pages* (a page holds `page_size` tokens). The implementation
counts tokens; `page_size` is what converts between the two, and deployment-level checks (see
`properties.DEPLOYMENT`) speak in tokens through it.

A `Config` is finite on purpose: the explicit-state checker enumerates every reachable state, so
every source of unbounded behaviour (faults, retransmissions, generations) is bounded by a field
here. `Config()`'s defaults (the `sequential` scenario) are the smallest configuration that can
tell the reference protocol from the incident: two tenants, three requests, one of them too long
for the prefill pool but short enough for decode's, one in flight at a time, one fault per run.
The CLI's default scenario, `wide`, has two requests in flight at once and two faults per run (see
`SCENARIOS` below).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, NewType

RequestIndex = NewType("RequestIndex", int)
PageId = NewType("PageId", int)
Generation = NewType("Generation", int)
Room = NewType("Room", int)
TenantId = NewType("TenantId", str)


class ConfigError(ValueError):
    """A configuration value is out of range or malformed; the message names the field and value."""


@dataclass(frozen=True)
class RequestSpec:
    """One client request: who sends it, how long its prompt is, and its room.

    The room is the id both workers use to match messages to the request (SGLang's
    `bootstrap_room`). Rooms are normally unique, but clients can supply them and fan-outs reuse
    them (sglang #40125, #26486), so two requests may share one; both named scenarios have that.
    """

    tenant: str
    pages: int
    room: int


@dataclass(frozen=True)
class Config:
    """A scenario for the checkers. All lengths are in pages."""

    decode_pages: int = 3
    """Physical pages in decode's KV pool."""
    page_size: int = 16
    """Tokens per page; used only to speak about the deployment in tokens."""
    prefill_pool_pages: int = 2
    """Capacity of prefill's KV pool."""
    context_window: int = 4
    """The advertised window: the router refuses prompts longer than this."""
    prefill_max_prompt: int = 2
    """Longest prompt prefill admits (derived from its pool in a real engine)."""
    decode_max_prompt: int = 3
    """Longest prompt decode admits (derived from its pool)."""
    requests: tuple[RequestSpec, ...] = (
        RequestSpec("a", 2, 1),
        RequestSpec("b", 3, 2),
        RequestSpec("b", 2, 1),
    )
    prefill_ranks: int = 1
    """Prefill ranks (tensor-parallel workers of the one prefill instance): each writes its own
    shard of every granted page and reports its own completion, and decode accepts the transfer
    only when every rank's has arrived (see `state.py`, "Prefill ranks"). At most 4."""
    prefill_instances: int = 1
    """Prefill instances (workers) the router may place a request on, 1 to 3. Real deployments
    run several (SGLang's, vLLM's and Dynamo's routers pick one prefill and one decode worker per
    request). The router's choice would be recorded per request, each instance with its own boot
    epoch, and a restart would lose only its own requests. So far only the value 1 is modelled:
    every engine refuses a larger one with a reason (`instances_unsupported`), and 1 keeps every
    state space exactly as it was."""
    decode_instances: int = 1
    """Decode instances, 1 to 3, each with its own pool and generation counter (two instances
    can issue the same generation for one room: a hazard only several instances show). Decode's
    `decode_pages` are split among them in contiguous blocks (page q belongs to instance
    `q * decode_instances // decode_pages`), so `decode_pages` must be at least
    `decode_instances`. As with `prefill_instances`, only 1 is modelled so far."""
    max_active: int = 1
    """Requests the router lets be in progress at once (submitted and not yet answered)."""
    submit_in_order: bool = True
    """The router submits requests in list order; it keeps small configs small."""
    max_faults: int = 1
    """Faults of any kind in one run; the per-kind limits below apply as well."""
    max_crashes: int = 1
    """Prefill plus decode crash-restarts."""
    max_drops: int = 1
    """Control messages lost in the network."""
    max_duplicates: int = 1
    """Control messages delivered twice."""
    max_timeouts: int = 1
    """Decode waiting timeouts (and release timeouts where a variant has them)."""
    max_cancels: int = 1
    """Client cancellations."""
    max_prefill_aborts: int = 1
    """Prefill-local aborts (client abort at prefill, grammar error, running timeout)."""
    max_partitions: int = 0
    """Network partitions in which decode's health check takes a live prefill for dead
    (`decode_suspect_prefill_dead`). 0 by default: the fault multiplies the states of every
    scenario, and the pinned counts (the sequential scenario's 71,075 for the reference) are
    without it; `--set max_partitions=1` turns it on."""
    response_bound: int = 0
    """Bounded response: once faults stop, steps within which every request must end; 0 = any
    finite bound (no cycle, no stuck state)."""
    max_retries: int = 0
    """Times in one run the client submits a request again under the same request id and room,
    after it got an error for it (`router_retry_request`). A retry is client behaviour, not a
    fault: it has its own budget and does not count against `max_faults`. 0 (the default)
    keeps every scenario's state space as it was before retries were modelled."""

    def __post_init__(self) -> None:
        positive = ("decode_pages", "page_size", "prefill_pool_pages", "context_window")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        non_negative = (
            "prefill_max_prompt",
            "decode_max_prompt",
            "max_faults",
            "max_crashes",
            "max_drops",
            "max_duplicates",
            "max_timeouts",
            "max_cancels",
            "max_prefill_aborts",
            "max_partitions",
            "response_bound",
            "max_retries",
        )
        for name in non_negative:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
        ranks = self.prefill_ranks
        if not isinstance(ranks, int) or not 1 <= ranks <= 4:
            raise ConfigError(
                f"prefill_ranks must be an integer from 1 to 4 (the explicit model is meant for "
                f"few ranks), got {ranks!r}"
            )
        for name in ("prefill_instances", "decode_instances"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 3:
                raise ConfigError(
                    f"{name} must be an integer from 1 to 3 (the explicit model is meant for few "
                    f"instances), got {value!r}"
                )
        if self.decode_pages < self.decode_instances:
            raise ConfigError(
                f"decode_pages={self.decode_pages} is fewer than decode_instances="
                f"{self.decode_instances}: every decode instance needs at least one page of its "
                "own"
            )
        if self.max_active < 1:
            raise ConfigError(f"max_active must be at least 1, got {self.max_active!r}")
        if not self.requests:
            raise ConfigError("requests must name at least one request")
        if len(self.requests) > 6:
            raise ConfigError(
                f"{len(self.requests)} requests: the explicit model is meant for at most 6"
            )
        for i, r in enumerate(self.requests):
            if not r.tenant or not r.tenant.isidentifier():
                raise ConfigError(
                    f"request {i}: tenant must be a short identifier, got {r.tenant!r}"
                )
            if r.pages < 1:
                raise ConfigError(f"request {i}: pages must be at least 1, got {r.pages}")
            if r.room < 1:
                raise ConfigError(f"request {i}: room must be at least 1, got {r.room}")

    def page_instance(self, page: int) -> int:
        """The decode instance page `page` belongs to: the pool is split in contiguous blocks."""
        return page * self.decode_instances // self.decode_pages

    @property
    def tenants(self) -> tuple[str, ...]:
        return tuple(sorted({r.tenant for r in self.requests}))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["requests"] = [asdict(r) for r in self.requests]
        # One instance of each is every scenario written before instances were named, and what
        # the model supports: leaving the fields out then keeps every committed trace, log and
        # result that carries a config byte-for-byte as it was (`from_json` reads them back as
        # 1). A scenario with several instances names them.
        for name in ("prefill_instances", "decode_instances"):
            if data[name] == 1:
                del data[name]
        return data

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Config:
        known = {f.name for f in fields(Config)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown config keys {sorted(unknown)}; known keys: {sorted(known)}")
        kwargs = dict(data)
        if "requests" in kwargs:
            try:
                kwargs["requests"] = tuple(
                    RequestSpec(str(r["tenant"]), int(r["pages"]), int(r["room"]))
                    for r in kwargs["requests"]
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigError(
                    "requests must be a list of {tenant, pages, room} objects"
                ) from exc
        return Config(**kwargs)


def instances_unsupported(config: Config) -> str | None:
    """Why a checker cannot take this configuration's instances, or None where it can.

    Several prefill or decode instances (`Config.prefill_instances`, `Config.decode_instances`)
    are validated and documented, but not yet modelled by the rulebook: the router's choice of
    instances, per-instance epochs, generation counters and restarts are future work. Rather than
    check a one-instance model under a several-instance name, every engine refuses with this
    reason."""
    if config.prefill_instances == 1 and config.decode_instances == 1:
        return None
    return (
        f"prefill_instances={config.prefill_instances}, decode_instances="
        f"{config.decode_instances}: several instances are not modelled yet (the rulebook has "
        "one prefill and one decode instance); check with prefill_instances=1 and "
        "decode_instances=1"
    )


def default_config() -> Config:
    """`Config()`: the `sequential` scenario, what the library's callers and the tests start from
    (the CLI starts from `DEFAULT_SCENARIO`)."""
    return Config()


# Named scenarios, what `--scenario NAME` starts from before `--set` overrides.
#
# `wide`, the CLI's default (`DEFAULT_SCENARIO`), is the smallest scenario with two requests in
# flight at once and two faults per run: the two share room 1 (a room collision between live
# requests, what a client-chosen room or an n>1 fan-out gives), and tenant b's prompt is too long
# for prefill but not for decode, the incident's shape. It keeps two requests, not three, so that
# the explorer checks it in well under a minute.
#
# `sequential` is `Config()`'s own defaults, the module docstring's: three requests, one in flight
# at a time, one fault per run. It was the CLI's default until two in flight became it; the tests,
# the docs' counterexamples, the pinned state counts (71,075 for the reference) and the
# catalogue's `breaks=` are stated on it, and a variant whose search is slow on `wide` names it as
# its own (`Variant.scenario_name`).
SCENARIOS: dict[str, tuple[str, Config]] = {
    "wide": (
        "two requests of two tenants sharing room 1 (b's too long for prefill), both in flight "
        "at once, two faults per run (of two kinds)",
        Config(
            requests=(RequestSpec("a", 2, 1), RequestSpec("b", 3, 1)),
            max_active=2,
            max_faults=2,
        ),
    ),
    "sequential": (
        "three requests of two tenants (one too long for prefill, two sharing room 1), "
        "one in flight at a time, one fault per run",
        Config(),
    ),
}

DEFAULT_SCENARIO = "wide"
"""The scenario `kvhandoff check`, `review` and `matrix` check when no `--scenario` is named
(and the variant names none of its own)."""


def scenario_config(name: str) -> Config:
    """The named scenario's configuration (see `SCENARIOS`)."""
    try:
        return SCENARIOS[name][1]
    except KeyError:
        known = ", ".join(SCENARIOS)
        raise ConfigError(f"unknown scenario {name!r}; known scenarios: {known}") from None


def _parse_requests(text: str) -> tuple[RequestSpec, ...]:
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3:
            raise ConfigError(
                f"requests item {item!r}: expected TENANT:PAGES:ROOM, e.g. requests=a:2:1,b:3:2"
            )
        tenant, pages, room = parts
        try:
            out.append(RequestSpec(tenant, int(pages), int(room)))
        except ValueError as exc:
            raise ConfigError(f"requests item {item!r}: PAGES and ROOM must be integers") from exc
    return tuple(out)


def parse_set(base: Config, assignments: list[str]) -> Config:
    """Apply `KEY=VALUE` overrides (the CLI's `--set`) to a config, with errors that name the key."""
    types = {f.name: f.type for f in fields(Config)}
    changes: dict[str, Any] = {}
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE")
        if key not in types:
            raise ConfigError(f"--set {key}: unknown key; known keys: {', '.join(sorted(types))}")
        if key == "requests":
            changes[key] = _parse_requests(value)
        elif types[key] in ("bool", bool):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ConfigError(f"--set {key}={value}: expected true or false")
            changes[key] = value.lower() in ("true", "1")
        else:
            try:
                changes[key] = int(value)
            except ValueError as exc:
                raise ConfigError(f"--set {key}={value}: expected an integer") from exc
    return replace(base, **changes)


__all__ = [
    "DEFAULT_SCENARIO",
    "SCENARIOS",
    "Config",
    "ConfigError",
    "Generation",
    "PageId",
    "RequestIndex",
    "RequestSpec",
    "Room",
    "TenantId",
    "default_config",
    "instances_unsupported",
    "parse_set",
    "scenario_config",
]
