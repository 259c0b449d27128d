"""placeholder"""
from __future__ import annotations
from typing import Any
def fixed_invariants(enc: Any) -> dict[str, Any]:
    return {}
