"""Load a variant by catalogue name or from a user's Python file (`VARIANT = Variant(...)`).

A variant file is the user's code, run inside the checker. Whatever goes wrong in it is bad input
(exit 2), never a verdict about the protocol: a traceback with exit 1 reads in CI as "this change
breaks a property". So:
- an exception while the file loads (a typo in a design option is a `VariantError` raised there)
  is a `VariantLoadError` naming the file and the line of the file it came from;
- the file's hooks (`step_overrides`, `extra_actions`) are wrapped so that an exception inside
  one, while any engine or replay runs it, is a `VariantCodeError` naming the file, the line, the
  hook and the action it was stepping.

A trace names the variant it was made with (`trace_variant_header`): a catalogue name, or a
file's path and the sha256 of its content, so that `explain` and `replay` can find the variant
again without being told, and say so when the file has changed since (`variant_of_trace`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from kvhandoff.spec.config import Config
from kvhandoff.spec.state import State
from kvhandoff.spec.variants import VARIANTS, FormulaEffect, Variant, VariantError, get_variant


class VariantLoadError(ValueError):
    """The variant name is unknown or the file does not define a usable VARIANT."""


class VariantCodeError(Exception):
    """Code in a variant file raised an exception while a check or a replay ran it (exit 2).

    Not a `ValueError` on purpose: the spec's replay turns a `ValueError` of a step into "this
    step is not enabled", which would blame the trace for a bug in the variant."""


def load_variant(name_or_path: str) -> Variant:
    if not name_or_path.endswith(".py"):
        try:
            return get_variant(name_or_path)
        except KeyError as exc:
            raise VariantLoadError(str(exc.args[0])) from None
    path = Path(name_or_path)
    if not path.is_file():
        raise VariantLoadError(f"variant file {name_or_path!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"kvhandoff_user_variant_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise VariantLoadError(f"variant file {name_or_path!r} cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a user's file: report whatever it raised, and where
        where = _where_in(path, exc, exc.__traceback__) or name_or_path
        what = str(exc) if isinstance(exc, VariantError) else f"{type(exc).__name__}: {exc}"
        raise VariantLoadError(f"{where}: variant file failed to load: {what}") from exc
    variant = getattr(module, "VARIANT", None)
    if not isinstance(variant, Variant):
        raise VariantLoadError(
            f"variant file {name_or_path!r} must define VARIANT = Variant(...) "
            "(e.g. VARIANT = REFERENCE.derive('my_change', 'what it changes', scrub=False))"
        )
    return _guarded(variant, name_or_path)


def _where_in(path: Path, exc: BaseException, tb: TracebackType | None) -> str | None:
    """`path:line` of the deepest frame of `tb` in the user's file (a `SyntaxError` has none: its
    line is on the exception)."""
    target = path.resolve()
    if isinstance(exc, SyntaxError) and exc.filename and Path(exc.filename).resolve() == target:
        return f"{path}:{exc.lineno}"
    frames = [f for f in traceback.extract_tb(tb) if Path(f.filename).resolve() == target]
    return f"{path}:{frames[-1].lineno}" if frames else None


def _defined_at(hook: Callable[..., Any], path: str) -> str:
    code = getattr(hook, "__code__", None)
    return f"{path}:{code.co_firstlineno}" if code is not None else path


def _guarded(variant: Variant, path: str) -> Variant:
    """`variant` with each hook wrapped to report an exception as a `VariantCodeError`."""
    file = Path(path)

    def failed(hook: Callable[..., Any], what: str, exc: Exception) -> VariantCodeError:
        where = _where_in(file, exc, exc.__traceback__) or _defined_at(hook, path)
        return VariantCodeError(
            f"{where}: the variant's {what} raised {type(exc).__name__}: {exc} "
            "(a bug in the variant file, not a verdict about the protocol)"
        )

    def step_hook(name: str, hook: Callable[[Config, State, Any], State]) -> Any:
        @functools.wraps(hook)
        def run(config: Config, state: State, action: Any) -> State:
            try:
                return hook(config, state, action)
            except VariantCodeError:
                raise
            except Exception as exc:
                raise failed(hook, f"step override {name!r} (stepping {action!r})", exc) from exc

        return run

    def enabled_hook(hook: Callable[[Config, State], Iterable[Any]]) -> Any:
        @functools.wraps(hook)
        def run(config: Config, state: State) -> list[Any]:
            try:
                return list(hook(config, state))
            except VariantCodeError:
                raise
            except Exception as exc:
                raise failed(hook, "extra_actions", exc) from exc

        return run

    # A formula effect is the spec's own reading of a formula, not the file's code: kept as it is,
    # so that the Z3 engines still see the formula.
    overrides = {
        k: v if isinstance(v, FormulaEffect) else step_hook(k, v)
        for k, v in variant.step_overrides.items()
    }
    extra = None if variant.extra_actions is None else enabled_hook(variant.extra_actions)
    return replace(variant, step_overrides=overrides, extra_actions=extra)


# --- Which variant a trace was made with ---------------------------------------------------------


def file_digest(path: str | Path) -> str:
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


def trace_variant_header(name_or_path: str) -> dict[str, str]:
    """The header fields that name the variant `name_or_path` (as given to `load_variant`) in a
    trace, beside its name: for a file, `variant_file` (the path as given) and `variant_sha256`
    (its content). A catalogue variant needs none: its name finds it."""
    if not name_or_path.endswith(".py") or not Path(name_or_path).is_file():
        return {}
    return {"variant_file": name_or_path, "variant_sha256": file_digest(name_or_path)}


@dataclass(frozen=True)
class TraceVariant:
    variant: Variant
    note: str = ""
    """Something the user should know about how the variant was found (e.g. the file changed)."""


_CATALOGUE = {v.name for v in VARIANTS}


def variant_of_trace(header: Mapping[str, Any], given: str | None = None) -> TraceVariant:
    """The variant to replay a trace with: `given` (a `--variant`), else the one its header names.

    A header naming a file: the file is loaded if it still exists; when its sha256 differs from the
    header's, the note says so (the replay may then fail, and the message says why it might)."""
    if given:
        return TraceVariant(load_variant(given))
    name = header.get("variant")
    path = header.get("variant_file")
    if isinstance(path, str) and path:
        if not Path(path).is_file():
            raise VariantLoadError(
                f"the trace was made with variant file {path!r}, which no longer exists "
                "(pass --variant PATH.py)"
            )
        variant = load_variant(path)
        want = header.get("variant_sha256")
        note = ""
        if isinstance(want, str) and want != file_digest(path):
            note = (
                f"variant file {path} has changed since the trace was made (its sha256 differs "
                "from the trace header's): replaying with the file as it is now"
            )
        return TraceVariant(variant, note)
    if not isinstance(name, str) or not name:
        raise VariantLoadError("the header names no variant (pass --variant NAME)")
    if name not in _CATALOGUE:
        raise VariantLoadError(
            f"the header names variant {name!r}, which is not in the catalogue and comes with no "
            "variant_file (pass --variant PATH.py)"
        )
    return TraceVariant(get_variant(name))
