"""`pram-release diff`: what a release of a spec would change against the last published release of its name.

The matrices compared are randomized response's closed forms: k-ary RR with γ keeps a value with probability
γ / (γ + k − 1) and moves it to each other category with 1 / (γ + k − 1)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import numpy as np
import pytest
import yaml

from flows.cli import main
from pram_lib.core.codec import encode_noise
from pram_lib.core.jsonable import to_json
from pram_lib.ops.audit import AuditLog
from pram_lib.pipeline import diff, release, stream
from pram_lib.pipeline.publish import channels_document
from pram_lib.spec import load_spec
from tests import synth


def rr(k: int, gamma: float) -> tuple[float, float]:
    return gamma / (gamma + k - 1), 1 / (gamma + k - 1)


def publish_fake(spec_path: Path, folder: str = "synth-20260101T000000Z") -> Path:
    """A published release of the spec as the flow leaves it for diff: its channels.json in the output folder
    and the audit entry that vouches for it (the channels chosen from the source as a release would)."""
    spec = load_spec(spec_path)
    run = spec.on_engine(spec.engine.mode)
    seed = secrets.randbits(128)
    profile = stream.finish_profile(run, stream.profile_pass(run, seed))
    doc = to_json(channels_document(spec, release.choose_channels(spec, profile, seed)))
    out = spec.resolve(spec.output) / folder
    out.mkdir(parents=True)
    (out / "channels.json").write_text(json.dumps(doc))
    AuditLog(spec.resolve(spec.private_store) / "audit.jsonl").append("release-published", release=spec.release,
                                                                       folder=folder)
    return out


def edit(spec_path: Path, fn) -> None:
    d = yaml.safe_load(spec_path.read_text())
    fn(d)
    spec_path.write_text(yaml.safe_dump(d, sort_keys=False))


def test_an_unchanged_spec_is_no_change_and_exit_0(tmp_path, capsys):
    spec = synth.write_spec(tmp_path)
    folder = publish_fake(spec)
    assert main(["diff", str(spec)]) == 0
    out = capsys.readouterr().out
    assert f"against {folder}" in out and "no change." in out and "\n~ " not in out and "\n+ " not in out
    assert main(["diff", str(spec), "--all"]) == 0
    assert "= colour" in capsys.readouterr().out


def test_a_changed_level_shows_the_new_epsilon_and_the_largest_matrix_change_exit_1(tmp_path, capsys):
    spec = synth.write_spec(tmp_path)
    publish_fake(spec)
    edit(spec, lambda d: d["variables"][0].update(gamma=4.0))
    assert main(["diff", str(spec)]) == 1
    out = capsys.readouterr().out
    (p0, q0), (p1, q1) = rr(3, 3.0), rr(3, 4.0)
    largest = max(abs(p1 - p0), abs(q1 - q0))   # 2/3 − 3/5 on the diagonal
    assert f"ε: {np.log(3.0):.4g} -> {np.log(4.0):.4g}" in out
    assert f"largest change of a matrix entry: {largest:.4g}" in out
    assert "~ colour" in out and "size" not in out.split("largest interval")[0]   # size did not change


def test_a_category_added_is_listed_and_the_matrix_compared_on_the_common_ones(tmp_path, capsys):
    spec = synth.write_spec(tmp_path)
    publish_fake(spec)
    edit(spec, lambda d: d["variables"][0].update(categories=[*synth.COLOURS, "purple"]))
    assert main(["diff", str(spec)]) == 1
    out = capsys.readouterr().out
    (p0, q0), (p1, q1) = rr(3, 3.0), rr(4, 3.0)
    assert "categories added: purple" in out
    assert f"largest change of a matrix entry: {max(abs(p1 - p0), abs(q1 - q0)):.4g}" in out


def test_variables_added_and_removed(tmp_path, capsys):
    spec = synth.write_spec(tmp_path)
    publish_fake(spec)
    edit(spec, lambda d: d.update(variables=d["variables"][:1] + [
        {"column": "score", "channel": "laplace-noise", "eta": 2.0, "accept_lower_protection": True}]))
    assert main(["diff", str(spec)]) == 1
    out = capsys.readouterr().out
    assert "- size\n    no longer released" in out
    assert "+ score\n    new:" in out and "not DP" in out


def test_no_earlier_release_is_all_new_and_a_bad_spec_is_exit_2(tmp_path, capsys):
    spec = synth.write_spec(tmp_path)
    assert main(["diff", str(spec)]) == 1
    out = capsys.readouterr().out
    assert "no published release of 'synth'" in out and "+ colour" in out and "+ size" in out
    edit(spec, lambda d: d["variables"][0].update(gamma=-1.0))
    assert main(["diff", str(spec)]) == 2
    assert "gamma" in capsys.readouterr().err


def test_diff_writes_nothing_and_spends_nothing(tmp_path):
    spec = synth.write_spec(tmp_path, population={"key": "synth-pop", "cap": 10.0})
    publish_fake(spec)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    assert main(["diff", str(spec)]) == 0
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


def test_noise_parameters_compared():
    def entry(theta, eta):
        return {**encode_noise(["score"], theta, eta, theta * (theta + 1) * eta ** 2, "m", float("nan"), {}),
                "family": "two-sided-gamma"}

    (same,) = diff.compare([entry(1.0, 2.0)], [entry(1.0, 2.0)])
    assert same.kind == "="
    (c,) = diff.compare([entry(1.0, 2.0)], [entry(1.0, 3.0)])
    assert c.kind == "~" and "eta: 2 -> 3" in c.lines and "noise variance: 8 -> 18" in c.lines


@pytest.mark.parametrize("stratum", ["sex=Female", "sex=Male"])
def test_strata_are_channels_of_their_own(stratum):
    from pram_lib.core.codec import encode_categorical

    def entry(label, keep):
        return {**encode_categorical(["occupation"], ["a", "b"], None, [keep, keep], None, np.log(keep / (1 - keep)), "m", True,
                                     float("nan"), {}), "stratum": label, "strata_columns": ["sex"],
                "stratum_key": [label.split("=")[1]]}

    other = "sex=Male" if stratum == "sex=Female" else "sex=Female"
    out = diff.compare([entry(stratum, 0.7), entry(other, 0.7)], [entry(stratum, 0.8), entry(other, 0.7)])
    changed = {c.name: c.kind for c in out}
    assert changed == {f"occupation [{stratum}]": "~", f"occupation [{other}]": "="}
