"""A point is one type: its fields are the measured run settings (written out, and held to them here),
and its key, label, the sweep's axes and the summary's columns all come from it."""
import json
import typing
from dataclasses import fields

from bench.core.point import AXES, COLUMNS, FIELDS, LATER_AXES, NOT_MEASURED, RUN_SETTINGS, Point, _run_fields, blank
from bench.measure.sweep.sweep_config import SweepConfig

ROW = {"mode": "spec", "dtype": "float32", "prompts": "/p/code.jsonl", "deployment": "inproc", "policy": "greedy",
       "k": 4, "entropy_threshold": 0.0, "accept_threshold": 0.1, "verifier": "cached", "draft_stop": "none",
       "k_schedule": "constant", "id": "p0", "tokens": [1, 2]}


def drift(written: list[tuple[str, object]], expected: list[tuple[str, object, type]]) -> list[str]:
    """What the written Point's (name, type) fields lack or get wrong against `expected` (`_run_fields()`),
    each as a line saying where to fix it."""
    names = [name for name, _ in written]
    types = dict(written)
    problems = []
    for i, (name, hint, cls) in enumerate(expected):
        if name not in types:
            after = f"after {expected[i - 1][0]!r}" if i else "first"
            problems.append(f"Point has no field {name!r} ({cls.__name__}.{name}, a measured run setting): add "
                            f"`{name}: {hint} = None  # what it means` to Point in bench/core/point.py, {after}, "
                            "or name it in NOT_MEASURED there if it does not change what is measured")
        elif types[name] != hint:
            problems.append(f"Point.{name} is typed {types[name]}, its setting {cls.__name__}.{name} gives {hint}: "
                            "change it in bench/core/point.py")
    problems += [f"Point.{name} is no measured run setting: remove it from bench/core/point.py"
                 for name in names if name not in {name for name, *_ in expected}]
    if not problems and names != [name for name, *_ in expected]:
        problems.append(f"Point's fields must follow the run settings' order {[name for name, *_ in expected]}, "
                        f"got {names}: reorder them in bench/core/point.py")
    return problems


def test_the_written_point_is_exactly_the_measured_run_settings_in_order():
    hints = typing.get_type_hints(Point)
    written = [(f.name, hints[f.name]) for f in fields(Point)]
    problems = drift(written, _run_fields())
    assert not problems, "\n".join(problems)
    assert written == [(name, hint) for name, hint, _ in _run_fields()]
    assert all(f.default is None for f in fields(Point))


def test_a_setting_missing_from_point_is_named_with_where_it_goes():
    hints = typing.get_type_hints(Point)
    written = [(f.name, hints[f.name]) for f in fields(Point)]
    [missing] = drift([f for f in written if f[0] != "draft_topn"], _run_fields())
    assert missing.startswith("Point has no field 'draft_topn' (SpecConfig.draft_topn, a measured run setting)")
    assert "`draft_topn: int | None = None  # what it means` to Point in bench/core/point.py, after 'punct_trigger'" in missing
    assert drift([*written, ("extra", str | None)], _run_fields()) == \
        ["Point.extra is no measured run setting: remove it from bench/core/point.py"]
    [retyped] = drift([("mode", int | None), *written[1:]], _run_fields())
    assert retyped.startswith("Point.mode is typed int | None, its setting EngineConfig.mode gives str | None")
    [order] = drift([written[1], written[0], *written[2:]], _run_fields())
    assert order.startswith("Point's fields must follow the run settings' order ['mode', 'edge', ")


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
    stored = json.dumps({**{axis: ROW.get(axis) for axis in AXES if axis not in LATER_AXES}, "id": "p0"}, sort_keys=True)
    assert Point.from_row(ROW).key(id="p0") == stored
    # an axis added later is left out at the value earlier results had, and named at any other
    assert Point.from_row({**ROW, "drafter": "model"}).key() == Point.from_row(ROW).key()
    assert '"drafter": "prompt-lookup"' in Point.from_row({**ROW, "drafter": "prompt-lookup"}).key()
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
