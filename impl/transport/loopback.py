"""Keep Mooncake's listeners on loopback.

Mooncake 0.3.x binds its handshake and TCP data listeners to the wildcard address and has no
setting to change that (``MC_TCP_BIND_ADDRESS`` only changes the address it advertises). Those
listeners take one-sided writes into registered memory without authentication, so kvhandoff
preloads a tiny ``bind()`` wrapper (``loopback_bind.c``) that turns a wildcard bind into a loopback
one. Preloading has to happen when the process starts: ``kvhandoff serve --transport mooncake``
re-executes itself with it, the test suite does the same (tests/impl/conftest.py), and anything
else gets a clear error from the transport naming the variable to set.

``python -m kvhandoff.impl.transport.loopback build`` compiles the wrapper next to the virtual environment
(`make venv` runs it); ``python -m kvhandoff.impl.transport.loopback path`` prints where it is.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

from kvhandoff.impl.errors import ConfigError

SOURCE = Path(__file__).with_name("loopback_bind.c")
MARKER = "kvhandoff_loopback_bind_active"


def library_path() -> Path:
    return Path(sys.prefix) / "lib" / "kvhandoff_loopback_bind.so"


def build(force: bool = False) -> Path:
    """Compile the wrapper (needs a C compiler); a no-op when it is newer than its source."""
    out = library_path()
    if not force and out.exists() and out.stat().st_mtime >= SOURCE.stat().st_mtime:
        return out
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise ConfigError(
            "no C compiler (cc or gcc) to build the loopback bind wrapper that the mooncake "
            "transport needs; install one (apt-get install gcc)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    result = subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(tmp), str(SOURCE), "-ldl"],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise ConfigError(f"building {out.name} with {cc} failed:\n{result.stderr.strip()}")
    tmp.replace(out)
    return out


def is_loaded() -> bool:
    """Whether this process runs with the wrapper preloaded (it exports a marker symbol)."""
    return hasattr(ctypes.CDLL(None), MARKER)


def preload_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the wrapper added to LD_PRELOAD (built first if needed)."""
    lib = str(build())
    current = [p for p in env.get("LD_PRELOAD", "").split(":") if p and p != lib]
    return {**env, "LD_PRELOAD": ":".join([lib, *current])}


def reexec_with_preload() -> None:
    """Start this command again (same interpreter and arguments) with the wrapper preloaded,
    unless it already is. Once only: if it is still missing after that, the transport's own
    error explains. Raises ConfigError when the wrapper cannot be built."""
    if is_loaded() or os.environ.get("KVHANDOFF_PRELOAD_TRIED"):
        return
    env = preload_env(dict(os.environ))
    env["KVHANDOFF_PRELOAD_TRIED"] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def main(argv: list[str]) -> int:
    if argv == ["build"]:
        print(build())
        return 0
    if argv == ["path"]:
        print(library_path())
        return 0
    print("usage: python -m kvhandoff.impl.transport.loopback build|path", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
