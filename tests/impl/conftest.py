from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvhandoff.impl.cluster import Cluster, start_cluster

# benchmarks/gpu_check.sh runs the cluster tests on the GPU with KVHANDOFF_TEST_DEVICE=cuda.
DEVICE = os.environ.get("KVHANDOFF_TEST_DEVICE", "cpu")


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """Start clusters on loopback (on DEVICE) with logs under tmp_path; all are stopped afterwards."""
    started: list[Cluster] = []

    def make(mode: str = "reference", **settings: Any) -> Cluster:
        settings.setdefault("device", DEVICE)
        settings.setdefault("log_dir", tmp_path / f"logs-{len(started)}")
        settings.setdefault("state_dir", tmp_path / f"state-{len(started)}")
        cluster = start_cluster(mode, **settings)
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        cluster.stop()
