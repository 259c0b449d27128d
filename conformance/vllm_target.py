"""`kvhandoff conform --target vllm`: vLLM 0.33.0's scheduler-side KV-transfer lifecycle.

vLLM lives in an environment of its own (`make venv-vllm` makes `.venv-vllm`, pinned in
tests/engines/vllm-requirements.txt). This target starts `conformance.vllm_harness` with that
environment's interpreter, waits for the harness service's address and then is a plain
`RemoteTarget`, exactly as `--target sglang` is. Nothing of vLLM's listens: the NIXL connector's
scheduler side starts its handshake listener only when workers publish their metadata, and there
are no workers (docs/vllm.md); the harness service itself listens on 127.0.0.1.
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
VENV = Path(os.environ.get("KVHANDOFF_VLLM_VENV", ROOT / ".venv-vllm"))
"""`make venv-vllm`'s environment; KVHANDOFF_VLLM_VENV names another."""
START_TIMEOUT_S = 180.0
"""vLLM's import takes 5-30 s on two busy cores."""


class VllmUnavailable(TargetError):
    """The vLLM environment is missing or its harness did not start (the message says how to
    make it); a target failure, so the CLI exits 3, never a verdict."""


def vllm_python(venv: Path = VENV) -> Path:
    """The vLLM environment's interpreter; raises `VllmUnavailable` naming the make target."""
    python = venv / "bin" / "python"
    if not python.exists():
        raise VllmUnavailable(
            f"no vLLM environment at {venv} (run `make venv-vllm`: about 1.9 GB and a few "
            "minutes; see docs/vllm.md)"
        )
    return python


class VllmTarget(RemoteTarget):
    """Starts the harness in `.venv-vllm` on first use; stops it at `shutdown`."""

    def __init__(self, venv: Path = VENV, timeout_s: float = 120.0) -> None:
        self._venv = venv
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: list[str] = []
        super().__init__("127.0.0.1:1", timeout_s=timeout_s)

    def _launch(self) -> None:
        python = vllm_python(self._venv)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT)
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "127.0.0.1"
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        self._proc = subprocess.Popen(
            [str(python), "-m", "kvhandoff.conformance.vllm_harness", "--listen", "127.0.0.1:0"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self._proc.stdout is not None and self._proc.stderr is not None
        threading.Thread(target=self._drain, args=(self._proc.stderr,), daemon=True).start()
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
            raise VllmUnavailable(
                f"the vLLM harness did not start (exit {code}): {tail or 'no output'}"
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
