"""The check behind every "this --json output matches its published schema" assertion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

from kvhandoff.cli.output import SCHEMA_VERSION

SCHEMAS = Path(__file__).resolve().parent.parent / "docs" / "schemas"


def assert_matches_schema(kind: str, obj: Any) -> None:
    """`obj` carries the id of docs/schemas/<kind>.schema.json and validates against it."""
    schema = json.loads((SCHEMAS / f"{kind}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$id"] == f"kvhandoff.{kind}/{SCHEMA_VERSION}"
    jsonschema.validate(obj, schema)
    assert obj["schema"] == schema["$id"]
