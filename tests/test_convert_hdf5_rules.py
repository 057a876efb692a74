"""The pure rules of the HDF5 converter, without files: layout detection, the JPEG row cut and the
/compress_len row choice, the mapping parser, group globs, natural order, robomimic rates and splits
(hypothesis where a rule has a property, examples where it is a table)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robowds.export.convert.hdf5.frames import EOI, SOI, cut_jpeg_rows, fits, pick_length_row
from robowds.export.convert.hdf5.layout import (DatasetInfo, aloha_keys, detect_layout, natural_key, robomimic_keys,
                                                robomimic_rate, split_of_demos, step_kind, unique_fields)
from robowds.export.convert.hdf5.mapping import match_groups, parse_mapping

NAMES = st.text("abcdefghij_0123456789", min_size=1, max_size=8)
SERIES = DatasetInfo((10, 3), "float32")


def _outline(paths) -> dict[str, DatasetInfo]:
    return {p: SERIES for p in paths}


# ---- layout detection ------------------------------------------------------------------------------------

# paths that say nothing about robomimic or ALOHA (no top-level data/ or observations/, no /action)
NEUTRAL = st.lists(st.lists(NAMES, min_size=1, max_size=3).map("/".join), max_size=6).map(
    lambda ps: [p for p in ps if p.split("/")[0] not in ("data", "observations", "action")])


@given(NEUTRAL, st.lists(st.integers(0, 50), min_size=1, max_size=4, unique=True), st.booleans())
def test_robomimic_is_detected_from_its_demo_groups_whatever_else_the_file_holds(noise, demos, obs_only) -> None:
    paths = noise + [f"data/demo_{d}/obs/eef_pos" if obs_only else f"data/demo_{d}/actions" for d in demos]
    assert detect_layout(_outline(paths)) == "robomimic"


@given(NEUTRAL, st.booleans())
def test_aloha_needs_both_qpos_and_action_and_the_neither_case_is_unknown(noise, with_images) -> None:
    extra = ["observations/images/cam_high"] if with_images else []
    assert detect_layout(_outline(noise + extra + ["observations/qpos", "action"])) == "aloha"
    assert detect_layout(_outline(noise + extra + ["observations/qpos"])) is None
    assert detect_layout(_outline(noise + ["action"])) is None
    assert detect_layout(_outline(noise)) is None


def test_a_file_with_both_layouts_is_ambiguous() -> None:
    assert detect_layout(_outline(["data/demo_0/actions", "observations/qpos", "action"])) is None


def test_each_layout_maps_its_datasets_to_keys() -> None:
    outline = _outline(["data/demo_0/obs/eef_pos", "data/demo_0/next_obs/eef_pos", "data/demo_0/actions",
                        "data/demo_0/obs/extra/force", "data/demo_1/actions"])
    assert robomimic_keys(outline, "demo_0") == [("actions", "actions"), ("obs/eef_pos", "eef_pos"),
                                                 ("obs/extra/force", "obs_extra_force")]
    aloha = _outline(["observations/qpos", "observations/images/cam_high", "action", "base_action", "compress_len"])
    assert aloha_keys(aloha) == [("action", "action"), ("base_action", "base_action"),
                                 ("observations/images/cam_high", "cam_high"), ("observations/qpos", "qpos")]


@pytest.mark.parametrize("shape,dtype,kind", [
    ((10,), "float64", "timeseries"), ((10, 7), "float32", "timeseries"), ((10, 3, 3), "float32", "timeseries"),
    ((10, 2), "bool", "timeseries"), ((10, 48, 64, 3), "uint8", "video"), ((10,), "vlen-bytes", "video"),
    ((10,), "vlen-uint8", "video"), ((10, 2000), "uint8", "timeseries"),  # padded rows only where the layout says so
    ((10, 48, 64, 1), "float32", None), ((10, 48, 64), "uint8", None), ((10,), "str", None), ((), "float32", None),
    ((10, 48, 64, 3), "float32", None),
])
def test_step_kind_by_shape_and_dtype(shape, dtype, kind) -> None:
    assert step_kind(DatasetInfo(shape, dtype)) == kind


# ---- JPEG rows -------------------------------------------------------------------------------------------

# a JPEG-like file: SOI, any bytes (FF D9 included, as inside a header table), EOI; the row padding is zeros
JPEG = st.binary(max_size=40).map(lambda body: SOI + body + EOI)


def _pad(jpegs: list[bytes], width: int) -> np.ndarray:
    rows = np.zeros((len(jpegs), width), np.uint8)  # [T, L]
    for k, data in enumerate(jpegs):
        rows[k, :len(data)] = np.frombuffer(data, np.uint8)
    return rows


@given(st.lists(JPEG, min_size=1, max_size=8), st.integers(0, 10))
def test_cutting_padded_rows_gives_back_each_jpeg_with_or_without_lengths(jpegs, extra) -> None:
    rows = _pad(jpegs, max(map(len, jpegs)) + extra)
    lengths = np.array([len(j) for j in jpegs])
    assert cut_jpeg_rows(rows, lengths) == jpegs
    assert cut_jpeg_rows(rows, None) == jpegs  # after the last end-of-image marker: the padding is zeros
    assert fits(rows, lengths)


@settings(max_examples=60)
@given(st.lists(st.lists(JPEG, min_size=3, max_size=6), min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_the_compress_len_row_found_cuts_each_camera_into_its_own_jpegs(cameras, rnd) -> None:
    """Rows of /compress_len in any order (the recorder's camera order, which the file does not keep):
    whichever row is picked, the frames cut with it are the camera's JPEG files."""
    steps = min(map(len, cameras))
    cameras = [c[:steps] for c in cameras]
    width = max(len(j) for c in cameras for j in c)
    order = list(range(len(cameras)))
    rnd.shuffle(order)  # order[r] = the camera whose lengths are in row r
    compress_len = np.array([[len(j) for j in cameras[cam]] for cam in order])  # [cams, T]
    for cam, jpegs in enumerate(cameras):
        rows = _pad(jpegs, width)
        row = pick_length_row(rows, compress_len, preferred=cam)
        assert row is not None
        assert cut_jpeg_rows(rows, compress_len[row]) == jpegs
        if fits(rows, compress_len[cam]):
            assert row == cam  # the name-order row is kept whenever it fits


@pytest.mark.parametrize("row,lengths,message", [
    (b"\x00" * 8, None, "step 0: no JPEG end-of-image marker"),
    (b"\x00\x00\xff\xd9", None, "step 0: the row does not start with a JPEG start-of-image marker"),
    (SOI + b"ab" + EOI, [9], "step 0: length 9 is outside the row of 6 bytes"),
    (SOI + b"ab" + EOI, [5], "step 0: the 5 bytes do not end with a JPEG end-of-image marker"),
])
def test_a_row_that_is_not_one_jpeg_is_named(row, lengths, message) -> None:
    with pytest.raises(ValueError, match=message):
        cut_jpeg_rows(np.frombuffer(row, np.uint8)[None], None if lengths is None else np.array(lengths))


# ---- mapping, globs, order, rates, splits ----------------------------------------------------------------

@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=20, unique=True))
def test_natural_order_sorts_demo_numbers_as_numbers(numbers) -> None:
    names = [f"demo_{n}" for n in numbers]
    assert sorted(names, key=natural_key) == [f"demo_{n}" for n in sorted(numbers)]


@given(st.lists(st.lists(NAMES, min_size=1, max_size=3).map("/".join), max_size=12, unique=True), NAMES)
def test_a_group_glob_matches_level_by_level(groups, prefix) -> None:
    found = match_groups(f"{prefix}/*", groups)
    assert found == sorted((g for g in groups if g.count("/") == 1 and g.split("/")[0] == prefix), key=natural_key)
    assert match_groups("", ["", *groups]) == [""]


def test_the_mapping_parser_names_each_mistake() -> None:
    ok = parse_mapping({"episodes": "/data/demo_*/", "rate_hz": 10, "fields": {"joints": "obs/q", "task": {"attr": "lang"},
                                                                              "cam": {"path": "img", "kind": "video"}}})
    assert (ok.episodes, ok.rate_hz, [f.name for f in ok.fields], ok.fields[2].video) == \
        ("data/demo_*", 10.0, ["joints", "task", "cam"], True)
    for data, message in [
        ({"fields": {"a": "x"}, "rate": 3}, "unknown key\\(s\\) \\['rate'\\]"),
        ({"fields": {"Joints": "x"}}, "field name 'Joints' is not a store field name.*write 'joints'"),
        ({"fields": {"a": {"path": "x", "attr": "y"}}}, "fields.a needs exactly one of path"),
        ({"fields": {"a": "x"}, "rate_hz": 5, "time": "t"}, "give rate_hz or time, not both"),
        ({"fields": {"a": "x"}, "time_unit": "h"}, "time_unit 'h'"),
        ({"fields": {"a": {"path": "x", "interpolation": "cubic"}}}, "interpolation 'cubic'"),
        ({"fields": {"t": {"attr": "lang"}}}, "only attributes"),
        ({"fields": []}, "fields must map"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_mapping(data)


@pytest.mark.parametrize("env_args,rate", [
    (json.dumps({"env_kwargs": {"control_freq": 20}}), 20.0), (json.dumps({"env_kwargs": {}}), None),
    (b'{"env_kwargs": {"control_freq": 15.5}}', 15.5), ("not json", None), (None, None),
    (json.dumps({"env_kwargs": {"control_freq": 0}}), None), (json.dumps({"env_kwargs": {"control_freq": True}}), None),
])
def test_robomimic_rate_from_env_args(env_args, rate) -> None:
    assert robomimic_rate(env_args) == rate


def test_robomimic_masks_give_splits_and_a_demo_in_two_is_refused() -> None:
    masks = {"train": ["demo_0", "demo_2"], "valid": ["demo_1"], "20_percent": ["demo_0"]}
    assert split_of_demos(masks, None) == {"demo_0": "train", "demo_2": "train", "demo_1": "valid"}
    assert split_of_demos(masks, ["20_percent"]) == {"demo_0": "20_percent"}
    assert split_of_demos(masks, ()) == {}
    with pytest.raises(ValueError, match="demo 'demo_0' is in both mask/train and mask/20_percent"):
        split_of_demos(masks, ["train", "20_percent"])


@given(st.lists(st.text("abAB._-/ 01", min_size=1, max_size=40), max_size=10))
def test_field_names_are_distinct_and_never_a_taken_name(keys) -> None:
    names = unique_fields(keys, taken=("split",))
    assert len(set(names.values())) == len(names) and "split" not in names.values()
