"""Load a variant by catalogue name or from a user's Python file (`VARIANT = Variant(...)`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from spec.variants import Variant, get_variant


class VariantLoadError(ValueError):
    """The variant name is unknown or the file does not define a usable VARIANT."""


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
    except Exception as exc:  # a user's file: report whatever it raised
        raise VariantLoadError(
            f"variant file {name_or_path!r} failed to load: {type(exc).__name__}: {exc}"
        ) from exc
    variant = getattr(module, "VARIANT", None)
    if not isinstance(variant, Variant):
        raise VariantLoadError(
            f"variant file {name_or_path!r} must define VARIANT = Variant(...) "
            "(e.g. VARIANT = REFERENCE.derive('my_change', 'what it changes', scrub=False))"
        )
    return variant
