"""The release's plots drawn cheaply: no pyplot, one draw per file, the same bytes for the same inputs (the
files are hashed into the manifest), and every label and title inside the canvas.

References: matplotlib's own tight_layout, run on the finished figure, must not move an axes whose title
fits (our margins are its fixed point); geometry of the drawn artists' bounding boxes against the canvas.
"""

from __future__ import annotations

import gc
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pram_lib.pipeline import publish

pytestmark = pytest.mark.slow   # module fixtures run whole releases (`make test-fast` leaves it out)

LONG = "a_variable_name_long_enough_that_its_title_cannot_fit"
BAR_CATEGORIES = {
    "income": ["<=50K", ">50K"],
    "workclass": ["Private", "Self-emp-not-inc", "Local-gov", "State-gov", "Self-emp-inc", "Federal-gov",
                  "Without-pay", "Never-worked"],
    "education": ["HS-grad", "Some-college", "Bachelors", "Masters", "Assoc-voc", "11th", "Assoc-acdm", "10th",
                  "7th-8th", "Prof-school", "9th", "12th", "Doctorate", "5th-6th", "1st-4th", "Preschool"],
    "many": [f"category number {i}" for i in range(30)],
    "money$": ["$5 to $10", "under $5", "a much longer category label here", "x"],
    LONG: ["a", "b", "c"],
}


def overall_rows(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for var, cats in BAR_CATEGORIES.items():
        share = rng.dirichlet(np.ones(len(cats)))
        for c, p in zip(cats, share):
            rows.append(dict(variable=var, stratum="all", category=c, estimate=p - 0.01, lower=p - 0.05,
                             upper=p + 0.03, released_share=p))
    return pd.DataFrame(rows)


def curves_and_values(seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Logistic CDFs and densities on a grid; one variable on a million scale, so both axes get offset texts."""
    rng = np.random.default_rng(seed)
    frames, values = [], {}
    for var, loc, scale, kind in [("age", 40.0, 8.0, "identity"), ("capital_gain", 0.0, 1.0, "log1p"),
                                  ("income_in_dollars", 3e6, 4e5, "identity")]:
        x = np.linspace(loc - 6 * scale, loc + 6 * scale, 256)
        cdf = 1 / (1 + np.exp(-(x - loc) / scale))
        dens = cdf * (1 - cdf) / scale
        frames.append(pd.DataFrame(dict(variable=var, x=x, scale=kind, cdf=cdf, cdf_lower=cdf - 0.01,
                                        cdf_upper=cdf + 0.01, cdf_band_lower=cdf - 0.02, cdf_band_upper=cdf + 0.02,
                                        density=dens, density_lower=0.9 * dens, density_upper=1.1 * dens)))
        values[var] = rng.logistic(loc, scale, 2000)
    return pd.concat(frames, ignore_index=True), pd.DataFrame(values)


def new_stage(root: Path, name: str) -> publish.Stage:
    (root / name).mkdir(parents=True)
    return publish.Stage(root / name, root / f"{name}-final")


def write_all(stage: publish.Stage) -> list[str]:
    curves, values = curves_and_values()
    return publish.write_plots(stage, overall_rows()) + publish.write_noise_plots(stage, curves, values)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """Every figure the two writers saved, kept after saving (so their artists sit where they were drawn)."""
    figures = []
    save = publish._save_plot

    def keep(stage, fig, var):
        figures.append(fig)
        return save(stage, fig, var)

    publish._save_plot = keep
    try:
        files = write_all(new_stage(tmp_path_factory.mktemp("plots"), "stage"))
    finally:
        publish._save_plot = save
    return files, figures


def test_every_axes_with_its_labels_and_title_lies_inside_the_canvas(drawn):
    _, figures = drawn
    for fig in figures:
        renderer = fig.canvas.get_renderer()
        width, height = fig.bbox.width, fig.bbox.height
        boxes = [ax.get_tightbbox(renderer) for ax in fig.axes]     # ticks, labels, offset texts, title, legend
        for box in boxes:
            assert -1 <= box.x0 and box.x1 <= width + 1 and -1 <= box.y0 and box.y1 <= height + 1, \
                (fig.axes[0].get_title(), box.bounds, (width, height))
        for left, right in zip(boxes, boxes[1:]):                   # side-by-side axes keep apart
            assert left.x1 <= right.x0, (fig.axes[0].get_title(), left.bounds, right.bounds)


def test_margins_are_tight_layouts_own_where_the_title_fits(drawn):
    """tight_layout (which ignores a title's width) keeps our layout as it is, unless the title was too wide."""
    _, figures = drawn
    compared = 0
    for fig in figures:
        renderer = fig.canvas.get_renderer()
        if any(ax.title.get_window_extent(renderer).width > ax.bbox.width for ax in fig.axes):
            continue                                                # then we narrow the axes to fit it
        params = {k: getattr(fig.subplotpars, k) for k in ("left", "right", "bottom", "top", "wspace")}
        ours = [ax.get_position().bounds for ax in fig.axes]
        fig.tight_layout()
        theirs = [ax.get_position().bounds for ax in fig.axes]
        fig.set_layout_engine(None)                                    # leave the figure as it was
        fig.subplots_adjust(**params)
        px = np.array([fig.bbox.width, fig.bbox.height] * 2)
        assert np.allclose(np.array(ours) * px, np.array(theirs) * px, atol=1.0), fig.axes[0].get_title()
        compared += 1
    assert compared >= 5


def test_a_title_too_wide_for_the_canvas_is_set_smaller_not_cut(drawn):
    _, figures = drawn
    (fig,) = [f for f in figures if f.axes[0].get_title().startswith(LONG)]
    title = fig.axes[0].title
    assert title.get_fontsize() < 12                                  # axes.titlesize 'large' = 1.2 * 10 pt
    box = title.get_window_extent(fig.canvas.get_renderer())
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width


def test_dollar_signs_stay_literal(drawn):
    _, figures = drawn
    (fig,) = [f for f in figures if f.axes[0].get_title().startswith("money")]
    ax = fig.axes[0]
    labels = {t.get_text() for t in ax.get_xticklabels()}
    assert r"\$5 to \$10" in labels and r"under \$5" in labels
    assert ax.get_title().startswith(r"money\$:")


def test_no_layout_engine_is_left_for_savefig_to_redraw_with(drawn):
    _, figures = drawn
    assert all(fig.get_layout_engine() is None for fig in figures)


def test_the_garbage_collector_is_back_as_it_was(tmp_path):
    assert gc.isenabled()
    publish.write_plots(new_stage(tmp_path, "a"), overall_rows())
    assert gc.isenabled()
    gc.disable()
    try:
        publish.write_plots(new_stage(tmp_path, "b"), overall_rows())
        assert not gc.isenabled()
    finally:
        gc.enable()


FRESH_PROCESS = """
import hashlib, json, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
import matplotlib.figure
draws = []
draw = matplotlib.figure.Figure.draw
def counted(self, renderer):
    draws.append(1)
    return draw(self, renderer)
matplotlib.figure.Figure.draw = counted
from unit.pipeline import test_plots_speed as t
stage = t.new_stage(Path({root!r}), "fresh")
files = t.write_all(stage)
print(json.dumps({{"files": files, "draws": len(draws), "pyplot": "matplotlib.pyplot" in sys.modules,
                  "sha": {{f: hashlib.sha256((stage.tmp / f).read_bytes()).hexdigest() for f in files}}}}))
"""


def test_same_inputs_give_the_same_bytes_here_and_in_a_fresh_process_drawn_once_each_without_pyplot(drawn,
                                                                                                    tmp_path):
    files, _ = drawn
    first, second = new_stage(tmp_path, "one"), new_stage(tmp_path, "two")
    assert write_all(first) == write_all(second) == files
    here = {f: hashlib.sha256((first.tmp / f).read_bytes()).hexdigest() for f in files}
    assert here == {f: hashlib.sha256((second.tmp / f).read_bytes()).hexdigest() for f in files}
    script = FRESH_PROCESS.format(tests=str(Path(__file__).resolve().parents[2]), root=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300)
    fresh = json.loads(out.stdout.strip().splitlines()[-1])
    assert fresh["files"] == files and len(files) == len(BAR_CATEGORIES) + 3
    assert fresh["draws"] == len(files)                               # savefig's one draw; no layout pass
    assert fresh["pyplot"] is False
    assert fresh["sha"] == here
