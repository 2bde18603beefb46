"""A point is one type: its fields come from the run settings, and its key, label, the sweep's axes
and the summary's columns all come from it."""
import json
from dataclasses import fields

from bench.core.point import AXES, COLUMNS, FIELDS, NOT_MEASURED, RUN_SETTINGS, Point, blank
from bench.measure.sweep_config import SweepConfig

ROW = {"mode": "spec", "dtype": "float32", "prompts": "/p/code.jsonl", "deployment": "inproc", "policy": "greedy",
       "k": 4, "entropy_threshold": 0.0, "accept_threshold": 0.1, "verifier": "cached", "draft_stop": "none",
       "k_schedule": "constant", "id": "p0", "tokens": [1, 2]}


def test_every_measured_run_setting_is_a_point_field():
    settings = {f.name for cls in RUN_SETTINGS for f in fields(cls)}
    assert settings - set(NOT_MEASURED) <= set(FIELDS)
    assert not set(NOT_MEASURED) & set(FIELDS)
    assert {"deployment", "link"} <= set(FIELDS)


def test_the_sweeps_axes_are_the_point_fields_it_takes_lists_of():
    sweep = {f.name: f for f in fields(SweepConfig)}
    assert all(isinstance(sweep[axis].default, tuple) for axis in AXES)
    assert [f for f in FIELDS if isinstance(sweep[f].default, tuple)] == sorted(AXES, key=FIELDS.index)
    assert sorted(COLUMNS) == sorted(AXES) and COLUMNS[:3] == ["mode", "dtype", "prompts"]


def test_the_key_is_the_one_results_and_scores_were_written_with():
    # nll.jsonl stores these keys: the axes (None where a row lacks one) plus the prompt id, as sorted JSON
    stored = json.dumps({**{axis: ROW.get(axis) for axis in AXES}, "id": "p0"}, sort_keys=True)
    assert Point.from_row(ROW).key(id="p0") == stored
    assert Point.from_row(ROW).key() == Point.from_row({**ROW, "id": "other", "seed": 3}).key()


def test_labels_name_every_axis_off_its_default_so_points_never_collide():
    inproc, split = Point.from_row(ROW), Point.from_row({**ROW, "deployment": "split", "link": "4g", "overlap": False})
    assert inproc.label() == "spec float32 code greedy k=4 thr=0 p>=0.1 cached"
    assert split.label() == "spec float32 code greedy k=4 thr=0 p>=0.1 cached deployment=split link=4g overlap=False"
    assert Point.from_row({"mode": "cloud", "dtype": "float32", "prompts": "code", "k": "-"}).label() == "cloud float32 code"


def test_fields_that_do_not_apply_are_none():
    point = blank({"mode": "edge", "edge": "e", "cloud": "c", "k": 4, "overlap": True, "link": "4g", "dtype": "float32"})
    assert point == {"mode": "edge", "edge": "e", "cloud": None, "k": None, "overlap": None, "link": None,
                     "dtype": "float32"}
    assert blank({"mode": "cloud", "edge": "e", "cloud": "c"})["edge"] is None
    assert "link" not in Point.from_row(ROW).record() and Point.from_row(ROW).record(sweep=True)["link"] is None
