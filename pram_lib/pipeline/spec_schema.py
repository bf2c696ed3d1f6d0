"""The privacy spec's JSON Schema (pram_lib/schemas/spec.schema.json): generated from the spec models, committed,
and named by every example spec's `# yaml-language-server: $schema=...` line so editors complete and check fields.

Regenerate after changing a spec model: `pram-release schema --from-models > pram_lib/schemas/spec.schema.json`.
Reading the committed file (`pram-release schema`) imports neither the models nor pandas.
"""

from __future__ import annotations

import json
from pathlib import Path

SPEC_SCHEMA_FILE = Path(__file__).resolve().parents[1] / "schemas" / "spec.schema.json"
DRAFT = "https://json-schema.org/draft/2020-12/schema"   # what pydantic's GenerateJsonSchema writes
REGENERATE = "pram-release schema --from-models > pram_lib/schemas/spec.schema.json"


def committed_schema_text() -> str:
    """The committed schema, as shipped with the package."""
    return SPEC_SCHEMA_FILE.read_text(encoding="utf-8")


def generated_schema() -> dict:
    """The schema the spec models give (pydantic's `model_json_schema`), each variable a member of a union
    discriminated by `channel` (OpenAPI's `discriminator` keyword: JSON Schema validators ignore it, editors
    and readers use it; every member's `channel` is a `const`, so `oneOf` already picks one)."""
    from pram_lib.families import spec_models
    from pram_lib.spec import ReleaseSpec

    schema = ReleaseSpec.model_json_schema()
    members = {channel: f"#/$defs/{model.__name__}" for channel, model in spec_models()}
    items = schema["properties"]["variables"]["items"]
    if [m["$ref"] for m in items["oneOf"]] != list(members.values()):
        raise RuntimeError("the variables' union no longer lists one member per registered channel")
    items["discriminator"] = {"propertyName": "channel", "mapping": members}
    return {"$schema": DRAFT, **schema, "title": "pram-release privacy spec"}


def generated_schema_text() -> str:
    return json.dumps(generated_schema(), indent=2, ensure_ascii=False) + "\n"
