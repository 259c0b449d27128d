"""Suite-wide set-up: run the tests with the loopback bind wrapper preloaded.

The mooncake transport refuses to start unless the wrapper is in the process (Mooncake would
otherwise listen on every interface; see impl/transport/loopback.py), and preloading only works
at process start. So when the mooncake package is installed and the wrapper is missing, pytest
starts itself again with it, once, before any test runs.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

SLOW_LIST = Path(__file__).with_name("slow.txt")


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("KVHANDOFF_PRELOAD_TRIED") or importlib.util.find_spec("mooncake") is None:
        return
    from kvhandoff.impl.errors import ConfigError
    from kvhandoff.impl.transport import loopback

    if loopback.is_loaded():
        return
    try:
        env = loopback.preload_env(dict(os.environ))
    except ConfigError:
        return  # the mooncake tests then fail with the transport's own error
    env["KVHANDOFF_PRELOAD_TRIED"] = "1"
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.stop_global_capturing()  # the new process must write to the real stdout/stderr
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def _listed_slow() -> set[str]:
    lines = SLOW_LIST.read_text(encoding="utf-8").splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


@pytest.hookimpl(tryfirst=True)  # before `-m 'not slow'` deselects by the marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests tests/slow.txt names `slow`: the quick suite stays quick (see that file)."""
    listed = _listed_slow()
    root = f"{config.rootpath}/"
    seen: set[str] = set()
    for item in items:
        # Parameters that are paths of example files carry the checkout's absolute path.
        nodeid = item.nodeid.replace(root, "")
        if nodeid in listed:
            item.add_marker(pytest.mark.slow)
            seen.add(nodeid)
    whole_suite = all(Path(a).resolve() == config.rootpath / "tests" for a in config.args)
    stale = listed - seen
    if whole_suite and stale and not config.option.keyword:
        raise pytest.UsageError(
            f"tests/slow.txt names {len(stale)} test(s) the suite does not have (renamed or "
            f"removed? update the list): {', '.join(sorted(stale)[:5])}"
        )
