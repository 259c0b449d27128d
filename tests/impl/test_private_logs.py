"""Issue 15, private logs: an attacker who reads an event log and knows the (public) model tries
to get the prompt back by hashing every candidate page, as issue 15 did in seconds against the
unkeyed page digests. The same attack, run on the digests prefill really computed, recovers the
prompt exactly (so the attack is sound); run on what the log holds, it recovers nothing."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from kvhandoff.impl.cluster import Cluster
from kvhandoff.impl.eventlog import EventLog, key_id
from kvhandoff.impl.model import CopyHeadModel
from kvhandoff.impl.pool import page_digest, tensor_bytes, wire_pages
from kvhandoff.impl.tokenizer import encode

VOCAB = "ACGTNRYK"  # a small vocabulary: 8^4 = 4096 candidates per 4-token page
PROMPT = "GATTACAK"


def brute_force(cluster: Cluster, digests: dict[int, str]) -> str | None:
    """The prompt whose pages hash to ``digests`` (page index -> hex), or None."""
    shape = cluster.prefill_server.settings.shape
    model = CopyHeadModel(shape, torch.device("cpu"))
    candidates = ["".join(c) for c in itertools.product(VOCAB, repeat=shape.page_size)]
    k, v = model.prefill(encode("".join(candidates)))
    wire = wire_pages(k, v, shape)
    data = tensor_bytes(wire)
    by_digest = {
        page_digest(data[i * shape.page_bytes : (i + 1) * shape.page_bytes]).hex(): text
        for i, text in enumerate(candidates)
    }
    found = [by_digest.get(digests[i]) for i in sorted(digests)]
    return None if any(f is None for f in found) else "".join(f for f in found if f)


def test_a_prompt_cannot_be_recovered_from_the_event_log(
    make_cluster: Callable[..., Cluster], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_dir = tmp_path / "logs"
    cluster = make_cluster("reference", log_dir=log_dir)
    prefill_log = cluster.prefill_server.event_log
    raw: dict[int, str] = {}
    write = prefill_log.write

    def spy(event: str, args: dict[str, object]) -> None:
        if event == "prefill_write_page":
            raw[int(args["index"])] = str(args["digest"])  # type: ignore[call-overload]
        write(event, args)

    monkeypatch.setattr(prefill_log, "write", spy)
    with cluster.client() as c:
        assert c.generate("tenant-a", encode(PROMPT), 4).status == "ok"
    assert len(raw) == 2
    # The attack works on the digests as computed...
    assert brute_force(cluster, raw) == PROMPT
    # ...and fails on every digest any log holds.
    logged: dict[int, str] = {}
    for path in log_dir.glob("*.jsonl"):
        text = path.read_text()
        assert cluster.log_key.hex() not in text  # the key itself is never written
        lines = [json.loads(x) for x in text.splitlines()]
        assert lines[0]["digest_key_id"] == key_id(cluster.log_key)
        for line in lines[1:]:
            digest = line.get("args", {}).get("digest")
            if digest:
                assert digest not in raw.values()
            if line.get("event") == "prefill_write_page":
                logged[int(line["args"]["index"])] = line["args"]["digest"]
    assert sorted(logged) == [0, 1]
    assert brute_force(cluster, logged) is None


def test_logs_of_one_deployment_agree_on_equal_digests_and_differ_across_keys(
    tmp_path: Path,
) -> None:
    # Equality is all conformance/validate.py reads of a digest (empty or not, and equal or
    # not): keyed digests keep it within a deployment.
    a = EventLog(tmp_path / "a.jsonl", "prefill", "reference", {}, key=b"k" * 32)
    b = EventLog(tmp_path / "b.jsonl", "decode", "reference", {}, key=b"k" * 32)
    c = EventLog(tmp_path / "c.jsonl", "decode", "reference", {}, key=b"x" * 32)
    for log in (a, b, c):
        log.write("e", {"digest": "00ff", "empty": ""})
        log.write("e", {"digest": ""})
        log.close()
    out = {
        n: [json.loads(x) for x in (tmp_path / f"{n}.jsonl").read_text().splitlines()][1:]
        for n in "abc"
    }
    assert out["a"][0]["args"]["digest"] == out["b"][0]["args"]["digest"]
    assert out["a"][0]["args"]["digest"] != out["c"][0]["args"]["digest"]
    assert len(out["a"][0]["args"]["digest"]) == 32
    assert out["a"][1]["args"]["digest"] == ""  # "no digest" (M5) stays visible
