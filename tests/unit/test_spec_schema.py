"""The privacy spec's JSON Schema (pram_lib/schemas/spec.schema.json): it is what the spec models generate, every
example spec names it and meets it, every spec the loader accepts meets it, and the structural cases of the bad-input
catalogue (tests/system/test_bad_input.py) that a schema can express are refused by it too."""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

import synth
from flows.cli import main
from pram_lib.spec import load_spec
from pram_lib.pipeline.spec_schema import REGENERATE, SPEC_SCHEMA_FILE, generated_schema_text

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.yaml"))
SCHEMA_LINE = "# yaml-language-server: $schema=../pram_lib/schemas/spec.schema.json"


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CATALOGUE = _module(ROOT / "tests" / "system" / "test_bad_input.py", "bad_input_catalogue")
EXAMPLES = _module(ROOT / "tests" / "contract" / "examples.py", "contract_examples")


def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SPEC_SCHEMA_FILE.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def as_json(data):
    """A spec as an editor's YAML server hands it to the schema: JSON values."""
    return json.loads(json.dumps(data))


def test_committed_schema_is_what_the_models_generate():
    assert SPEC_SCHEMA_FILE.read_text(encoding="utf-8") == generated_schema_text(), \
        f"pram_lib/schemas/spec.schema.json is stale: regenerate it with `{REGENERATE}`"


def test_variables_are_a_union_discriminated_by_channel():
    from pram_lib.families import ENTRIES

    items = json.loads(SPEC_SCHEMA_FILE.read_text())["properties"]["variables"]["items"]
    assert items["discriminator"]["propertyName"] == "channel"
    assert sorted(items["discriminator"]["mapping"]) == sorted(e.name for e in ENTRIES)
    defs = json.loads(SPEC_SCHEMA_FILE.read_text())["$defs"]
    for channel, ref in items["discriminator"]["mapping"].items():
        assert defs[ref.removeprefix("#/$defs/")]["properties"]["channel"]["const"] == channel


def test_schema_command_prints_the_committed_file_without_heavy_imports(capsys):
    assert main(["schema"]) == 0
    assert capsys.readouterr().out == SPEC_SCHEMA_FILE.read_text(encoding="utf-8")
    probe = ("import io, sys, contextlib\nfrom flows.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()): main(['schema'])\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'prefect', 'great_expectations', 'pandas', "
             "'pydantic'}))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_every_example_spec_names_the_schema_and_meets_it(path):
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first == SCHEMA_LINE
    assert (path.parent / first.split("$schema=", 1)[1]).resolve() == SPEC_SCHEMA_FILE   # works from specs/
    load_spec(path)   # the loader accepts it: so must the schema
    errors = [e.message for e in validator().iter_errors(as_json(yaml.safe_load(path.read_text())))]
    assert not errors, errors


def test_specs_the_loader_accepts_meet_the_schema(tmp_path):
    """The catalogue's base spec, with every channel's contract example in turn (one of each entry)."""
    check = validator()
    for name, variable in [("base", None), *EXAMPLES.VARIABLES.items()]:
        d = synth.spec_dict(tmp_path, noise=True)
        if variable is not None:
            columns = variable.get("columns", [variable.get("column")])
            d["variables"] = [v for v in d["variables"] if v["column"] not in columns] + [copy.deepcopy(variable)]
            d["passthrough"] = [c for c in d["passthrough"] if c not in columns]
            d["budget"] = 9.0
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(d, sort_keys=False))
        load_spec(path)
        errors = [e.message for e in check.iter_errors(as_json(d))]
        assert not errors, (name, errors)


# The catalogue's structural cases: what a schema can say (unknown field, wrong type, a field on the wrong channel,
# missing required field, unknown channel, a bound or a pattern on one field).
REFUSED_BY_SCHEMA = {
    "missing release", "missing source", "missing budget", "no variables", "unknown top-level field",
    "unknown variable field", "budget not a number", "budget zero", "alpha a string", "unknown channel",
    "release name with a slash", "categories not a list", "matrix on another channel", "dp prior epsilon 0",
    "noise variable with alpha", "laplace-noise with theta", "theta above 1", "noise variable marked public",
    "population cap negative", "population key with spaces",
}


def test_structural_cases_of_the_bad_input_catalogue_are_refused_by_the_schema():
    check = validator()
    refused = set()
    for name in REFUSED_BY_SCHEMA:
        edit, source, _, _ = CATALOGUE.CASES[name]
        assert callable(edit) and source is None, name
        d = CATALOGUE.base()
        edit(d)
        if not check.is_valid(as_json(d)):
            refused.add(name)
    assert refused == REFUSED_BY_SCHEMA, sorted(REFUSED_BY_SCHEMA - refused)
