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

import itertools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal, NewType, get_args

RequestIndex = NewType("RequestIndex", int)
PageId = NewType("PageId", int)
Generation = NewType("Generation", int)
Room = NewType("Room", int)
TenantId = NewType("TenantId", str)
Placement = Literal["any", "fixed"]
RoomChoice = Literal["fixed", "any"]


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
    prefill_instance: int = 0
    """The prefill instance the router placed the request on (`Config.prefill_instances`; with
    one instance, 0). Read only where `Config.placement` is `fixed`."""
    decode_instance: int = 0
    """The decode instance the router placed the request on, whose pool and generation counter
    serve it (`Config.decode_instances`)."""


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
    request). Each request's messages go to the instance it was placed on (see `spec/state.py`,
    "Instances"). Every engine checks more than one (prove's any-size model: any number and
    any placement); of the conformance targets the in-process and the gRPC ones play several
    (`kvhandoff conform --instances`). Each instance may have
    `prefill_ranks` ranks. A crash restarts one instance, and a partition cuts one decode
    instance off one prefill instance (see `spec/state.py`, "Instances")."""
    decode_instances: int = 1
    """Decode instances, 1 to 3, each with its own pool and generation counter (two instances
    can issue the same generation for one room: a hazard only several instances show). Decode's
    `decode_pages` are split among them in contiguous blocks (page q belongs to instance
    `q * decode_instances // decode_pages`), so `decode_pages` must be at least
    `decode_instances`."""
    placement: Placement = "any"
    """How the router places requests on instances. `any`: wherever it likes, each request on one
    prefill and one decode instance chosen when it is submitted; the explorer checks every
    placement (up to relabelling the instances, see `placements`), so a verdict covers them all.
    `fixed`: where each request says (`RequestSpec.prefill_instance`, `decode_instance`; in
    `--set requests=` as `TENANT:PAGES:ROOM:P/D`). With one instance of each the two are one
    scenario."""
    rooms: RoomChoice = "fixed"
    """Who picks each request's room. `fixed`: the scenario, as each request says
    (`RequestSpec.room`). `any`: the client, as it likes (SGLang takes a client's
    `bootstrap_room`; fan-outs share one): every run of such clients is a run of one fixed
    choice of rooms, since a request keeps the room it was submitted with, and the rules only
    ever ask whether two rooms are equal, so the checkers search every way of sharing rooms
    among the requests (the requests' own rooms ignored; see `placements`) and a verdict covers
    them all."""
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
    max_write_errors: int = 0
    """Push path: page writes that fail on prefill's side mid-transfer (an RDMA or session error,
    `prefill_write_error`): prefill fails the transfer and tells decode while its other writes of
    the grant may still be on the wire. 0 by default, for the same reason as `max_partitions`;
    `--set max_write_errors=1` turns it on."""
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
            "max_write_errors",
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
        if self.placement not in get_args(Placement):
            raise ConfigError(
                f"placement must be one of {', '.join(get_args(Placement))}, got {self.placement!r}"
            )
        if self.rooms not in get_args(RoomChoice):
            raise ConfigError(
                f"rooms must be one of {', '.join(get_args(RoomChoice))} (fixed: as each request "
                f"says; any: chosen by the client, every choice checked), got {self.rooms!r}"
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
            for name, n in (
                ("prefill_instance", self.prefill_instances),
                ("decode_instance", self.decode_instances),
            ):
                value = getattr(r, name)
                if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < n:
                    raise ConfigError(
                        f"request {i}: {name} must be an instance from 0 to {n - 1} "
                        f"({name}s={n}), got {value!r}"
                    )
                if value and self.placement == "any":
                    raise ConfigError(
                        f"request {i}: {name}={value} under placement=any, where the router "
                        "chooses: set placement=fixed to place requests yourself"
                    )

    def page_instance(self, page: int) -> int:
        """The decode instance page `page` belongs to: the pool is split in contiguous blocks."""
        return page * self.decode_instances // self.decode_pages

    @property
    def tenants(self) -> tuple[str, ...]:
        return tuple(sorted({r.tenant for r in self.requests}))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        # One instance of each, and the router placing as it likes, is every scenario written
        # before instances were named: leaving those fields out then keeps every committed
        # trace, log and result that carries a config byte-for-byte as it was (`from_json` reads
        # them back as the defaults). A scenario with several instances names them.
        for name in ("prefill_instances", "decode_instances"):
            if data[name] == 1:
                del data[name]
        if data["placement"] == "any":
            del data["placement"]
        if data["rooms"] == "fixed":
            del data["rooms"]
        requests = []
        for r in self.requests:
            item = asdict(r)
            for name in ("prefill_instance", "decode_instance"):
                if item[name] == 0:
                    del item[name]
            requests.append(item)
        data["requests"] = requests
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
                    RequestSpec(
                        str(r["tenant"]),
                        int(r["pages"]),
                        int(r["room"]),
                        int(r.get("prefill_instance", 0)),
                        int(r.get("decode_instance", 0)),
                    )
                    for r in kwargs["requests"]
                )
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise ConfigError(
                    "requests must be a list of {tenant, pages, room} objects (with "
                    "prefill_instance and decode_instance where a request is placed)"
                ) from exc
        return Config(**kwargs)


def placements(config: Config) -> list[Config]:
    """The fixed scenarios that together make up `config`'s choices: where a router that places
    as it likes (`placement="any"`) puts each request, and which rooms clients that choose them
    (`rooms="any"`) give the requests; one per class of choices equal up to renaming.

    A request is placed, and has its room, when it is submitted, and keeps both, so every run of
    such a router and such clients is a run of one fixed choice, and checking each fixed choice
    checks them. Prefill instances are interchangeable (nothing in the model orders them), and so
    are decode instances with pools of the same size: renaming them maps one placement's runs
    onto the other's, page block onto page block, keeping the order of pages within each block
    (the only order the rules read). Rooms are only ever compared for equality, so what matters
    of a choice of rooms is which requests share one. So a choice is kept only in its canonical
    form: each instance (each room, numbered from 1) is first used by a request after every
    lower-numbered one (for decode instances only where all pools are the same size): two
    requests give 2 choices of rooms, three give 5. With one instance of each and the rooms as
    given (`placement="fixed"` or one instance; `rooms="fixed"`), the list is `[config]`."""
    place = config.placement == "any" and (
        config.prefill_instances > 1 or config.decode_instances > 1
    )
    if not place and config.rooms == "fixed":
        return [config]
    n = len(config.requests)
    sizes = [
        sum(1 for q in range(config.decode_pages) if config.page_instance(q) == i)
        for i in range(config.decode_instances)
    ]
    decode_symmetric = len(set(sizes)) == 1

    def choices(k: int, symmetric: bool) -> list[tuple[int, ...]]:
        out: list[tuple[int, ...]] = []
        for combo in itertools.product(range(k), repeat=n):
            if symmetric and any(x > max(combo[:i], default=-1) + 1 for i, x in enumerate(combo)):
                continue
            out.append(combo)
        return out

    given = config.requests
    rooms = (
        [tuple(r.room for r in given)]
        if config.rooms == "fixed"
        else [tuple(x + 1 for x in combo) for combo in choices(n, True)]
    )
    prefill = (
        choices(config.prefill_instances, True)
        if place
        else [tuple(r.prefill_instance for r in given)]
    )
    decode = (
        choices(config.decode_instances, decode_symmetric)
        if place
        else [tuple(r.decode_instance for r in given)]
    )
    out = []
    for room in rooms:
        for ps in prefill:
            for ds in decode:
                requests = tuple(
                    replace(r, room=m, prefill_instance=p, decode_instance=d)
                    for r, m, p, d in zip(given, room, ps, ds, strict=True)
                )
                out.append(replace(config, requests=requests, placement="fixed", rooms="fixed"))
    return out


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
_INSTANCES = Config(
    requests=(RequestSpec("a", 2, 1), RequestSpec("b", 3, 1)),
    max_active=2,
    max_faults=2,
    max_crashes=0,
    decode_pages=6,
    prefill_instances=2,
    decode_instances=2,
)
"""`wide` on two prefill and two decode instances (the `instances` scenario)."""

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
    "instances": (
        "wide, on two prefill and two decode instances of three pages each, the router "
        "placing each request anywhere (every placement checked); no restarts (kept small: "
        "see instance_faults); explore, bmc, spacer and prove (per placement) check it",
        _INSTANCES,
    ),
    "instance_faults": (
        "instances with one fault per run, which may be a crash of any one instance or a "
        "partition between any decode and any prefill instance (decode takes a live prefill "
        "for dead)",
        replace(_INSTANCES, max_faults=1, max_crashes=1, max_partitions=1),
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
        if len(parts) not in (3, 4):
            raise ConfigError(
                f"requests item {item!r}: expected TENANT:PAGES:ROOM (or TENANT:PAGES:ROOM:P/D, "
                "placed on prefill instance P and decode instance D), e.g. requests=a:2:1,b:3:2"
            )
        tenant, pages, room = parts[:3]
        try:
            spec = RequestSpec(tenant, int(pages), int(room))
        except ValueError as exc:
            raise ConfigError(f"requests item {item!r}: PAGES and ROOM must be integers") from exc
        if len(parts) == 4:
            p_inst, sep, d_inst = parts[3].partition("/")
            try:
                if not sep:
                    raise ValueError(parts[3])
                spec = replace(spec, prefill_instance=int(p_inst), decode_instance=int(d_inst))
            except ValueError as exc:
                raise ConfigError(
                    f"requests item {item!r}: the placement must be P/D, two instance numbers "
                    "(e.g. 0/1: prefill instance 0, decode instance 1)"
                ) from exc
        out.append(spec)
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
        elif key in ("placement", "rooms"):
            changes[key] = value.strip()  # checked against the choices by `Config`
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
    "RoomChoice",
    "TenantId",
    "default_config",
    "parse_set",
    "placements",
    "scenario_config",
]
