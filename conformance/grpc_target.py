"""The real gRPC servers on loopback as a target (coarse: judged on their event logs).

The servers run as they do in production (`impl.cluster.start_cluster`: prefill, decode and router
on 127.0.0.1, torch page pools, the copy-head model). Messages between them are real RPCs, so a
single message cannot be delivered or held from outside: this target offers the client
operations (submit, cancel), crashes (prefill and decode restarts through the cluster's hooks)
and `settle`, and is judged by validating the servers' merged event logs against the spec, by
the answers (every request answered, ok/error as the spec explains) and by canaries: prompts are
made of tokens only their tenant sends, and the copy-head model echoes the tokens of the pages it
attends over, so an answer carrying another tenant's tokens is a real cross-tenant read.

One cluster serves many traces while it stays quiescent (a fresh, clean cluster otherwise).
"""

from __future__ import annotations

import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kvhandoff.conformance.target import Event, Target, TargetAnswer, require_one_prefill_rank
from kvhandoff.conformance.validate import (
    deployment_of,
    instance_logs,
    merge_logs,
    read_log,
    role_and_instance,
    search_logs,
    server_name,
)
from kvhandoff.spec.actions import (
    Action,
    ClientCancelRequest,
    PrefillRestart,
    RouterSubmitRequest,
)
from kvhandoff.spec.config import Config


def canary_token(config: Config, tenant: str) -> int:
    """Byte token of a tenant's canary: 'A' + the tenant's index among the scenario's tenants."""
    return 65 + config.tenants.index(tenant)


class GrpcTarget(Target):
    name = "grpc"
    fine_grained = False
    # Several prefill and decode servers where the scenario has several instances, each
    # request pinned where the program's placement puts it (`Cluster.pin_placement`).
    instances = True

    def __init__(
        self, device: str = "cpu", transport: str = "grpc", **cluster_settings: Any
    ) -> None:
        self.device = device
        self.transport = transport  # page data path (impl.transport.TRANSPORT_NAMES)
        self.cluster_settings = cluster_settings  # extra ClusterConfig fields (fault campaigns)
        self.cluster: Any = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._key: tuple[Any, ...] | None = None
        self.trace_no = 0
        self.config: Config | None = None
        self.last_headers: list[dict[str, Any]] = []
        self.probe_every = 4
        """An adversarial round (`conformance.grpc_probe`) after every this many conforming
        traces (0: none). A round takes about 0.3 s; each round ends A's handoff its own way
        (`grpc_probe.FINALES`), so the first five rounds try them all."""
        self.rounds = 0
        self.probe_outcomes: dict[str, int] = {}
        """`attack:reaction` -> how many probes got it (coverage)."""

    # ------------------------------------------------------------------ lifecycle

    def start(self, config: Config, mode: str) -> None:
        from kvhandoff.impl.cluster import start_cluster

        require_one_prefill_rank(config, instances=True)
        key = (
            config.prefill_instances,
            config.decode_instances,
            mode,
            config.page_size,
            config.decode_pages,
            config.prefill_max_prompt,
            config.decode_max_prompt,
            config.context_window,
            len(config.requests),
        )
        if self.cluster is not None and (key != self._key or not self.cluster.quiescent()):
            self.shutdown()
        if self.cluster is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="kvhandoff-conform-")
            root = Path(self._tmp.name)
            self.log_dir = root / "logs"
            self.cluster = start_cluster(
                mode,
                device=self.device,
                page_size=config.page_size,
                # Requests run concurrently here: a pool that holds them all at once, so that
                # decode never refuses for a full pool (the spec's decode waits instead; see
                # the mapping's note on RESOURCE_EXHAUSTED).
                # (Sized for the longest prompts a scenario of as many requests can have, so
                # that scenarios that differ only in prompt lengths share a cluster.)
                # Per decode instance: the pool of each.
                decode_pages=max(
                    config.decode_pages // config.decode_instances,
                    len(config.requests) * (config.context_window + 1),
                ),
                prefill_instances=config.prefill_instances,
                decode_instances=config.decode_instances,
                prefill_pages=config.prefill_max_prompt,
                context_window=config.context_window * config.page_size,
                # The scenario's own decode limit, not the pool's: its exact-limit prompts are
                # the boundary the spec speaks of.
                decode_max_prompt=config.decode_max_prompt * config.page_size,
                heartbeat_interval_s=0.05,
                transport=self.transport,
                log_dir=self.log_dir,
                state_dir=root / "state",
                **self.cluster_settings,
            )
            self.cluster.wait_healthy()
            self._offsets: dict[str, int] = {}
            self._key = key
        self.trace_no += 1
        self.config = config
        self.mode = mode
        self.results: dict[int, Any] = {}
        self.threads: list[threading.Thread] = []
        self._restarted = False
        self._by_request: dict[int, threading.Thread] = {}
        self._mark()

    def _files(self) -> dict[str, Path]:
        """Each server's log by its name (`validate.server_name`: `decode1` for decode
        instance 1)."""
        c = self.cluster.config
        names = ["router"]
        names += [server_name("prefill", i) for i in range(c.prefill_instances)]
        names += [server_name("decode", j) for j in range(c.decode_instances)]
        return {s: self.log_dir / f"{s}.jsonl" for s in names}

    def _mark(self) -> None:
        for server, path in self._files().items():
            self._offsets[server] = _count_lines(path)

    def request_id(self, r: int) -> str:
        return f"t{self.trace_no}r{r}"

    # ------------------------------------------------------------------ operations

    def submit(self, r: int) -> None:
        assert self.config is not None
        spec = self.config.requests[r]
        tokens = [canary_token(self.config, spec.tenant)] * self.prompt_tokens(self.config, r)
        if self.config.prefill_instances > 1 or self.config.decode_instances > 1:
            self.cluster.pin_placement(
                self.request_id(r), spec.prefill_instance, spec.decode_instance
            )

        def call() -> None:
            with self.cluster.client() as c:
                self.results[r] = c.generate(
                    # As many tokens as the prompt: the copy head echoes every attended page.
                    spec.tenant,
                    tokens,
                    max_tokens=min(1024, len(tokens)),
                    request_id=self.request_id(r),
                    timeout=30,
                )

        th = threading.Thread(target=call, daemon=True)
        th.start()
        self.threads.append(th)
        self._by_request[r] = th

    def wait_answered(self, r: int) -> None:
        th = self._by_request.get(r)
        if th is not None:
            th.join(timeout=30)

    def cancel(self, r: int) -> bool:
        if r in self.results:
            return False
        with self.cluster.client() as c:
            try:
                c.cancel(self.request_id(r), timeout=5)
            except Exception:
                return False
        return True

    def restart_prefill(self, pinst: int = 0) -> None:
        self.cluster.crash_prefill(pinst)
        self.cluster.restart_prefill(pinst)
        self.cluster.wait_healthy()
        self._restarted = True

    def _decode_saw_prefill(self, timeout: float = 5.0) -> bool:
        """Wait until decode's health check has seen the current prefill boot (so a later trace
        does not inherit this one's restart detection)."""
        cluster = self.cluster
        epochs = [server.boot_epoch for server in cluster.prefill_servers]

        def seen() -> list[int | None]:
            return [
                decode.core.prefill_epoch_seen(i)
                for decode in cluster.decode_servers
                for i in range(len(epochs))
            ]

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cluster.runtime.call(seen) == epochs * len(cluster.decode_servers):
                return True
            time.sleep(0.01)
        return False

    def restart_decode(self, dinst: int = 0) -> None:
        self.cluster.crash_decode(dinst)
        self.cluster.restart_decode(dinst)
        self.cluster.wait_healthy()

    def settle(self) -> None:
        for th in self.threads:
            th.join(timeout=30)
        # Returns as soon as every server is idle; the bound is for a loaded machine, where
        # a prefill's late abort or its drain ack can take seconds to be answered.
        self.cluster.wait_quiescent(timeout=30)
        if self._restarted:
            self._decode_saw_prefill()

    def quiescent(self) -> bool:
        return bool(self.cluster.quiescent())

    def describe(self) -> str:
        # Every role that still holds something (`quiescent` asks all three), read on the
        # servers' loop.
        c = self.cluster

        def held() -> str:
            parts = []
            for j, server in enumerate(c.decode_servers):
                decode = server.core
                parts.append(
                    f"{server_name('decode', j)} {decode.active_requests()} "
                    f"({decode.used_pages} pages used)"
                )
            for i, server in enumerate(c.prefill_servers):
                if server.core.active_requests():
                    parts.append(f"{server_name('prefill', i)} {server.core.active_requests()}")
            router = c.router_server.core.active_requests()
            if router:
                parts.append(f"router {router}")
            return ", ".join(parts)

        return str(c.runtime.call(held))

    # ------------------------------------------------------------------ results

    def headers_and_events(self) -> tuple[list[dict[str, Any]], list[Event]]:
        headers, logs = self.headers_and_logs()
        return headers, merge_logs(logs)

    def headers_and_logs(self) -> tuple[list[dict[str, Any]], list[list[Event]]]:
        """Each server's lines since the last `take_events`, several instances of a role read
        as the validator reads them (`validate.instance_logs`: the spec's page numbers, each
        line's server naming its instance)."""
        headers: list[dict[str, Any]] = []
        files: list[tuple[Path, dict[str, Any], list[Event]]] = []
        for server, path in self._files().items():
            if not path.exists():
                continue
            header, events = read_log(path)
            headers.append(header)
            skip = max(0, self._offsets.get(server, 0) - 1)
            files.append((path, header, events[skip:]))
        return headers, instance_logs(files)

    def take_events(self) -> list[Event]:
        headers, events = self.headers_and_events()
        self.last_headers = headers
        self._mark()
        return events

    def answers(self) -> dict[int, TargetAnswer]:
        assert self.config is not None
        out = {}
        owners = {canary_token(self.config, t): t for t in self.config.tenants}
        for r, res in self.results.items():
            ans = TargetAnswer(res.status == "ok", res.code, res.error)
            own = self.config.requests[r].tenant
            if ans.ok:
                for tok in set(res.tokens):
                    tenant = owners.get(tok)
                    if tenant is not None and tenant != own:
                        writers = [
                            self.request_id(i)
                            for i, q in enumerate(self.config.requests)
                            if q.tenant == tenant
                        ]
                        ans.foreign.append((",".join(writers), tenant))
            out[r] = ans
        return out

    def answer_problems(self) -> list[str]:
        """Exact answers: the copy-head model echoes the prompt it attends over, so an ok
        answer to an all-canary prompt is exactly as many of the tenant's canary tokens as
        were asked for (anything else was generated from data that is not the prompt's)."""
        assert self.config is not None
        out = []
        for r, res in sorted(self.results.items()):
            if res.status != "ok":
                continue
            want = canary_token(self.config, self.config.requests[r].tenant)
            n = min(1024, self.prompt_tokens(self.config, r))
            tokens = list(res.tokens)
            if tokens != [want] * n:
                wrong = sorted({t for t in tokens if t != want})[:8]
                out.append(
                    f"answer to {self.request_id(r)} has {len(tokens)} tokens, "
                    f"{sum(t != want for t in tokens)} of them not the prompt's canary {want} "
                    f"(e.g. {wrong}); the spec's answer echoes the {n}-token prompt"
                )
        return out

    def adversary_round(self, config: Config) -> tuple[str, str, str] | None:
        """Play a faulty or malicious prefill against the live decode (`conformance.grpc_probe`),
        after a trace has been judged; the round's own events are in no trace's log. Returns
        (kind, property, message) when decode reacted otherwise than the spec requires."""
        every = self.probe_every
        if not every or self.cluster is None or (self.trace_no - 1) % every:
            return None
        from kvhandoff.conformance.grpc_probe import GrpcProber

        prober = GrpcProber(self, config, self.trace_no, self.rounds)
        self.rounds += 1
        try:
            return prober.run()
        finally:
            for pair, n in prober.outcomes.items():
                self.probe_outcomes[pair] = self.probe_outcomes.get(pair, 0) + n

    def dirty_free_pages(self) -> list[int]:
        """Decode pages that no request owns and that are not zero (freed pages must hold
        nothing readable: `freed_pages_hold_no_readable_data`)."""
        cluster = self.cluster
        servers = list(cluster.decode_servers)

        def scan() -> list[int]:
            # The spec's page numbers: decode instance j's pages after instances 0..j-1's.
            dirty = []
            base = 0
            for server in servers:
                core, pool = server.core, server.pool
                dirty += [
                    base + p
                    for p in range(pool.num_pages)
                    if core.owner_of(p) is None
                    and (bool(pool.k[:, p].any()) or bool(pool.v[:, p].any()))
                ]
                base += pool.num_pages
            return dirty

        result: list[int] = cluster.runtime.call(scan)
        return result

    def close(self) -> None:
        """Keep the cluster for the next trace (see `shutdown`)."""

    def shutdown(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with path.open() as f:
        return sum(1 for _ in f)


COARSE_ACTIONS = (RouterSubmitRequest, ClientCancelRequest, PrefillRestart)


def boundary_scenario(rng: random.Random, config: Config) -> tuple[Config, dict[int, int]]:
    """`config` with each request's prompt drawn from `campaign.boundary_tokens` (or its own
    length), and the requests' shortfall in tokens (`Target.shortfall`)."""
    from dataclasses import replace

    from kvhandoff.conformance.campaign import boundary_tokens

    ps = config.page_size
    lengths = boundary_tokens(config)
    requests = []
    shortfall: dict[int, int] = {}
    for r, q in enumerate(config.requests):
        tokens = rng.choice([q.pages * ps, *lengths])
        pages = -(-tokens // ps)
        requests.append(replace(q, pages=pages))
        if pages * ps != tokens:
            shortfall[r] = pages * ps - tokens
    return replace(config, requests=tuple(requests)), shortfall


def run_coarse_campaign(
    target: Target,
    target_name: str,
    mode: str,
    traces: int,
    steps: int,
    seed: int,
    config: Config,
    out: Path,
    crash_in_flight: bool = False,
    variant: Any = None,
) -> Any:
    """Random (seeded) request-level programs; each judged on its merged event log, answers and
    canaries. No shrinking: a failing trace's event log is saved for `kvhandoff validate-log`.
    `variant`: the spec the logs are judged against (default the reference; the SGLang runs
    also judge against the reference with SGLang's known design choices, docs/sglang.md).
    Any coarse target works (ours, or an engine behind the harness service): it is driven and
    judged through the `Target` API only, its servers' log headers read from `last_headers`."""
    from kvhandoff.conformance.campaign import CampaignReport, Coverage, Failure
    from kvhandoff.spec.config import placements
    from kvhandoff.spec.trace import dump_trace

    coverage = Coverage()
    # With several instances each trace plays one placement of the requests (drawn; with one
    # instance of each nothing is drawn, so such a campaign's traces are as before).
    placed = placements(config)
    prefills = config.prefill_instances
    if isinstance(target, GrpcTarget):
        target.probe_outcomes.clear()  # this campaign's probes only
        target.rounds = 0
    start = time.perf_counter()
    failures: list[Failure] = []
    done = 0
    step_count = 0
    try:
        for i in range(traces):
            rng = random.Random(seed * 1_000_003 + i)
            base = rng.choice(placed) if len(placed) > 1 else config
            scenario, shortfall = base, dict[int, int]()
            if rng.random() < 0.5:
                # Prompts at and around every limit and page boundary (see `boundary_tokens`).
                scenario, shortfall = boundary_scenario(rng, base)
            target.shortfall = shortfall
            target.start(scenario, mode)
            program: list[Action] = []
            submitted: list[int] = []
            for _ in range(steps):
                choices: list[Action] = []
                if len(submitted) < len(config.requests):
                    choices.append(RouterSubmitRequest(len(submitted)))
                choices += [ClientCancelRequest(r) for r in submitted]
                if config.max_crashes and rng.random() < 0.1:
                    choices.append(
                        PrefillRestart(pinst=rng.randrange(prefills))
                        if prefills > 1
                        else PrefillRestart()
                    )
                if not choices:
                    break
                action = rng.choice(choices)
                program.append(action)
                step_count += 1
                if isinstance(action, RouterSubmitRequest):
                    submitted.append(action.request)
                    target.submit(action.request)
                    time.sleep(rng.choice((0.0, 0.002, 0.01)))
                elif isinstance(action, ClientCancelRequest):
                    target.cancel(action.request)
                elif isinstance(action, PrefillRestart):
                    if not crash_in_flight:
                        # Crashes between requests keep the default campaign's programs
                        # replayable step by step; `crash_in_flight` (slow test) lets a crash
                        # hit requests in flight. "Between" means settled, not only answered:
                        # a cancelled request's hand-over to prefill can still be on its way
                        # (see the known finding in docs/conformance.md).
                        for r in submitted:
                            target.wait_answered(r)
                        target.settle()
                    if action.pinst:
                        target.restart_prefill(pinst=action.pinst)  # type: ignore[call-arg]
                    else:
                        target.restart_prefill()
            target.settle()
            done += 1
            events = target.take_events()
            headers = log_headers(target, scenario)
            problem = _judge(target, submitted, headers, events, coverage, variant)
            adversary_round = getattr(target, "adversary_round", None)
            in_round = False
            if problem is None and adversary_round is not None:
                problem = adversary_round(config)
                in_round = problem is not None
            if problem is not None:
                kind, prop, message = problem
                out.mkdir(parents=True, exist_ok=True)
                safe = target_name.replace(":", "_").replace("/", "_")
                path = out / f"conform-{safe}-{mode}-seed{seed}-trace{i}.jsonl"
                head = dump_trace(
                    scenario,
                    program,
                    kind="scenario",
                    mode=mode,
                    target=target_name,
                    **(
                        {"shortfall": {str(r): n for r, n in shortfall.items()}}
                        if shortfall
                        else {}
                    ),
                )
                path.write_text(head)
                log_path = path.with_suffix(".log.jsonl")
                import json

                log_path.write_text(
                    json.dumps({**headers[0], "server": "merged"}, sort_keys=True)
                    + "\n"
                    + "".join(json.dumps(e, sort_keys=True) + "\n" for e in events)
                )
                if in_round:
                    # The round ran after this (conforming) trace: its own events, all three
                    # servers' lines since the round began, are what to read.
                    log_path = path.with_suffix(".round.jsonl")
                    round_events = target.take_events()
                    log_path.write_text(
                        json.dumps({**headers[0], "server": "merged"}, sort_keys=True)
                        + "\n"
                        + "".join(json.dumps(e, sort_keys=True) + "\n" for e in round_events)
                    )
                    message += f" (the adversarial round's events: {log_path})"
                failures.append(Failure(kind, prop, str(log_path), message))
                target.shutdown()
                break
    finally:
        target.shutdown()
    return CampaignReport(
        target=target_name,
        mode=mode,
        traces=done,
        steps=steps,
        verdict="diverges" if failures else "conforms",
        failures=failures,
        seconds=time.perf_counter() - start,
        step_count=step_count,
        coverage=_with_probes(coverage, target),
    )


def _with_probes(coverage: Any, target: Target) -> Any:
    for pair, n in getattr(target, "probe_outcomes", {}).items():
        coverage.probes[pair] = coverage.probes.get(pair, 0) + n
    return coverage


def log_headers(target: Target, config: Config) -> list[dict[str, Any]]:
    """The event-log headers of a coarse target's servers (they carry its limits, from which the
    validator reads the scenario); the scenario's own limits when the target sent none."""
    headers: list[dict[str, Any]] = list(getattr(target, "last_headers", None) or [])
    if headers:
        return headers
    return [
        {
            "kvhandoff_trace": 1,
            "kind": "event_log",
            "server": "merged",
            "config": {
                "page_size": config.page_size,
                "decode_pages": config.decode_pages,
                "context_window": config.context_window * config.page_size,
                "prefill_max_prompt": config.prefill_max_prompt * config.page_size,
                "decode_max_prompt": config.decode_max_prompt * config.page_size,
            },
        }
    ]


SERVER_ORDER = {"router": 0, "harness": 0, "prefill": 1, "decode": 2}


def split_by_server(events: list[Event]) -> list[list[Event]]:
    """Per-server logs (each in its own order) from a merged list, router, prefill, decode."""
    by_server: dict[str, list[Event]] = {}
    for ev in events:
        by_server.setdefault(str(ev.get("server")), []).append(ev)

    def order(server: str) -> tuple[int, int, str]:
        role, instance = role_and_instance(server)
        return (SERVER_ORDER.get(role, 3), instance, server)

    return [by_server[s] for s in sorted(by_server, key=order)]


def _judge(
    target: Target,
    submitted: list[int],
    headers: list[dict[str, Any]],
    events: list[Event],
    coverage: Any = None,
    variant: Any = None,
) -> tuple[str, str, str] | None:
    logs = split_by_server(events)
    deployment = deployment_of(logs, headers)
    report = (
        search_logs(headers, logs, deployment=deployment)
        if variant is None
        else search_logs(headers, logs, variant, deployment)
    )
    if coverage is not None and report.ok:
        coverage.add_log(events, report.spec_actions)
    answers = target.answers()
    for r, ans in answers.items():
        for writer, tenant in ans.foreign:
            return (
                "isolation",
                "no_cross_tenant_read",
                f"answer to {target.request_id(r)} carries the canary of tenant {tenant} "
                f"(requests {writer})",
            )
    if not report.ok:
        prop = report.violated[0] if report.violated else "conformance"
        return ("unexplained_event", prop, report.message)
    for r in submitted:
        if r not in answers:
            return ("no_answer", "every_request_terminates", f"{target.request_id(r)} unanswered")
    if not target.quiescent():
        return ("not_quiescent", "every_request_terminates", target.describe())
    problems = getattr(target, "answer_problems", None)
    for problem in problems() if problems is not None else []:
        return ("data", "decode_reads_only_validated_pages", problem)
    dirty = getattr(target, "dirty_free_pages", None)
    pages = dirty() if dirty is not None else []
    if pages:
        return (
            "data",
            "freed_pages_hold_no_readable_data",
            f"decode pages {pages} are free and not zeroed after the run settled",
        )
    return None


__all__ = [
    "COARSE_ACTIONS",
    "GrpcTarget",
    "canary_token",
    "log_headers",
    "run_coarse_campaign",
    "split_by_server",
]
