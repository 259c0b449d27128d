"""A real engine as a conformance target: its harness runs in the engine's own environment.

An engine (SGLang, vLLM) brings dependencies that kvhandoff's do not match, so `make venv-ENGINE`
makes an environment of its own (`.venv-ENGINE`, pinned in tests/engines/ENGINE-requirements.txt).
An `EngineTarget` starts the engine's harness module with that environment's interpreter, waits
for the line `LISTENING ADDRESS` that the harness service prints, and is from then on a plain
`RemoteTarget`: every operation is one RPC of the harness protocol, exactly as for an engine
team's own harness. Closing the harness's stdin stops it.
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


class EngineUnavailable(TargetError):
    """The engine's environment is missing or its harness did not start (the message says how to
    make it); a target failure, so the CLI exits 3, never a verdict."""


class EngineTarget(RemoteTarget):
    """Starts the engine's harness on first use; stops it at `shutdown`. A subclass names the
    engine and may add to the harness's environment (`harness_env`)."""

    ENGINE = ""
    """The engine's name as `--target` takes it (also its make target, `make venv-ENGINE`)."""
    TITLE = ""
    """The engine's name in messages."""
    SIZE = ""
    """What `make venv-ENGINE` costs, for the message when the environment is missing."""
    START_TIMEOUT_S = 180.0
    """How long the harness may take to print its address (the engine's imports are slow)."""
    UNAVAILABLE: type[EngineUnavailable] = EngineUnavailable

    def __init__(self, venv: Path | None = None, timeout_s: float = 120.0) -> None:
        self._venv = venv if venv is not None else self.default_venv()
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: list[str] = []
        super().__init__("127.0.0.1:1", timeout_s=timeout_s)

    @classmethod
    def default_venv(cls) -> Path:
        """`make venv-ENGINE`'s environment; KVHANDOFF_ENGINE_VENV names another."""
        variable = f"KVHANDOFF_{cls.ENGINE.upper()}_VENV"
        return Path(os.environ.get(variable, ROOT / f".venv-{cls.ENGINE}"))

    @classmethod
    def available(cls, venv: Path | None = None) -> bool:
        return ((venv or cls.default_venv()) / "bin" / "python").exists()

    def python(self) -> Path:
        """The engine environment's interpreter; raises UNAVAILABLE naming the make target."""
        python = self._venv / "bin" / "python"
        if not python.exists():
            raise self.UNAVAILABLE(
                f"no {self.TITLE} environment at {self._venv} (run `make venv-{self.ENGINE}`: "
                f"{self.SIZE} and a few minutes; see docs/{self.ENGINE}.md)"
            )
        return python

    def harness_env(self, env: dict[str, str]) -> dict[str, str]:
        """The harness's environment, from this process's."""
        return env

    def _launch(self) -> None:
        python = self.python()
        env = self.harness_env(dict(os.environ))
        env["PYTHONPATH"] = str(ROOT)
        module = f"kvhandoff.conformance.{self.ENGINE}_harness"
        self._proc = subprocess.Popen(
            [str(python), "-m", module, "--listen", "127.0.0.1:0"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self._proc.stdout is not None and self._proc.stderr is not None
        threading.Thread(target=self._drain, args=(self._proc.stderr,), daemon=True).start()
        deadline = time.monotonic() + self.START_TIMEOUT_S
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
            raise self.UNAVAILABLE(
                f"the {self.TITLE} harness did not start (exit {code}): {tail or 'no output'}"
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
