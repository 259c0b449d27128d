"""`kvhandoff conform --target sglang`: SGLang 0.5.23's disaggregation classes as a target.

SGLang lives in an environment of its own (`make venv-sglang` makes `.venv-sglang`, pinned in
tests/engines/sglang-requirements.txt), since its dependencies and kvhandoff's differ. This
target starts `conformance.sglang_harness` with that environment's interpreter, preloading the
loopback bind wrapper (impl/transport/loopback_bind.c) so that Mooncake's listeners stay on
127.0.0.1, waits for the harness service's address and then is a plain `RemoteTarget`: every
operation is one RPC of the harness protocol, exactly as for an engine team's own harness.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

from kvhandoff.conformance.remote_target import RemoteTarget
from kvhandoff.conformance.target import TargetError

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("KVHANDOFF_SGLANG_VENV", ROOT / ".venv-sglang"))
"""`make venv-sglang`'s environment; KVHANDOFF_SGLANG_VENV names another."""
START_TIMEOUT_S = 240.0
"""SGLang's import takes 15-40 s on two busy cores, twice (decode, then prefill's process)."""


class SglangUnavailable(TargetError):
    """The SGLang environment is missing or its harness did not start (the message says how to
    make it); a target failure, so the CLI exits 3, never a verdict."""


def sglang_python(venv: Path = VENV) -> Path:
    """The SGLang environment's interpreter; raises `SglangUnavailable` naming the make target."""
    python = venv / "bin" / "python"
    if not python.exists():
        raise SglangUnavailable(
            f"no SGLang environment at {venv} (run `make venv-sglang`: about 2.6 GB and a few "
            "minutes; see docs/sglang.md)"
        )
    return python


class SglangTarget(RemoteTarget):
    """Starts the harness in `.venv-sglang` on first use; stops it at `shutdown`."""

    def __init__(self, venv: Path = VENV, timeout_s: float = 120.0) -> None:
        self._venv = venv
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: list[str] = []
        super().__init__("127.0.0.1:1", timeout_s=timeout_s)

    def _launch(self) -> None:
        from kvhandoff.impl.errors import ConfigError
        from kvhandoff.impl.transport import loopback

        python = sglang_python(self._venv)
        try:
            env = loopback.preload_env(dict(os.environ))
        except ConfigError as exc:
            raise SglangUnavailable(f"the loopback bind wrapper: {exc}") from exc
        env["PYTHONPATH"] = str(ROOT)
        self._proc = subprocess.Popen(
            [str(python), "-m", "kvhandoff.conformance.sglang_harness", "--listen", "127.0.0.1:0"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self._proc.stdout is not None and self._proc.stderr is not None
        err = self._proc.stderr
        threading.Thread(target=self._drain, args=(err,), daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        address = ""
        while time.monotonic() < deadline:
            line = self._proc.stdout.readline()
            if not line:
                break
            if line.startswith("LISTENING "):
                address = line.split()[1]
                break
        if not address:
            code = self._proc.poll()
            self._kill()
            tail = "".join(self._stderr[-8:]).strip()
            raise SglangUnavailable(
                f"the SGLang harness did not start (exit {code}): {tail or 'no output'}"
            )
        self.address = address

    def _drain(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self._stderr.append(str(line))
            del self._stderr[:-50]

    def connect(self) -> object:
        if self._proc is None:
            self._launch()
        return super().connect()

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # the harness stops when its stdin closes
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def shutdown(self) -> None:
        try:
            if self._proc is not None:
                super().shutdown()
        finally:
            self._kill()


def available(venv: Path = VENV) -> bool:
    return (venv / "bin" / "python").exists()
