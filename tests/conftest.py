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

import pytest


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
