"""GX's Data Docs templates are compiled once per process: a second suite compiles none, and its Data Docs are
the same pages."""

import jinja2
import pandas as pd

from pram_lib.core import validate


def _suite(folder):
    frame = pd.DataFrame({"c": pd.Categorical(["a", "b", "c"] * 40), "x": range(120)})
    columns = {"c": {"kind": "categorical", "domain": ["a", "b", "c"], "max_missing": 0},
               "x": {"kind": "numeric", "min": 0, "max": 200, "max_missing": 0}}
    return validate.validate_table(frame, columns, 120, folder)


def test_a_second_suite_compiles_no_template(tmp_path, monkeypatch):
    _suite(tmp_path / "first")   # this process's first suite compiles the templates
    compiled = []
    original = jinja2.Environment.compile

    def counting(self, *args, **kwargs):
        compiled.append(args[1] if len(args) > 1 else kwargs.get("name"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(jinja2.Environment, "compile", counting)
    first = _suite(tmp_path / "a")
    after_first = len(compiled)
    second = _suite(tmp_path / "b")
    assert len(compiled) == after_first == 0, compiled[:5]   # the first suite compiled every template a suite uses
    assert first["success"] and second["success"]
    assert first["rows"] == second["rows"]
    def pages(folder):   # the validation page's folder is named by the run's time
        return sorted(p.relative_to(folder).parts[:2] for p in folder.rglob("*.html"))

    assert pages(tmp_path / "a" / "data_docs") == pages(tmp_path / "b" / "data_docs")
    assert len(pages(tmp_path / "a" / "data_docs")) >= 3   # index, suite, validation
