"""The estimate step's split of the report's plots between the helper and the release's own process, which draw
at once: every categorical variable in exactly one part, in the report's order, and names whose plot files differ
only in case (between categorical variables, or with a continuous variable) drawn by one process."""

from __future__ import annotations

import pandas as pd

from tasks.results import _plot_halves


def _estimates(names):
    return pd.DataFrame({"variable": [n for n in names for _ in range(2)], "category": ["a", "b"] * len(names)})


def _names(frame):
    return list(dict.fromkeys(frame["variable"]))


def test_the_parts_split_the_variables_in_order_and_the_helpers_is_larger_with_continuous_ones():
    names = ["a", "b", "c", "d", "e", "f"]
    first, second = _plot_halves(_estimates(names), [])
    assert (_names(first), _names(second)) == (["a", "b", "c"], ["d", "e", "f"])
    first, second = _plot_halves(_estimates(names), ["age", "income"])   # (6 + 2 + 1) // 2 = 4 to the helper
    assert (_names(first), _names(second)) == (["a", "b", "c", "d"], ["e", "f"])
    assert len(first) + len(second) == 2 * len(names)


def test_names_whose_files_differ_only_in_case_are_drawn_by_one_process():
    first, second = _plot_halves(_estimates(["Region", "sex", "job", "region"]), [])
    assert (_names(first), _names(second)) == (["sex"], ["Region", "job", "region"])
    first, second = _plot_halves(_estimates(["AGE", "sex", "job", "town"]), ["age"])   # age: drawn here
    assert "AGE" in _names(second) and "AGE" not in _names(first)


def test_no_categorical_variable_leaves_both_parts_empty():
    first, second = _plot_halves(_estimates([]).iloc[0:0], ["age"])
    assert first.empty and second.empty
