"""The pure pieces of the RLDS converter, property-tested: episode spans from is_first/is_last against
a step-by-step reference, TFRecord framing round trips and single-byte damage always caught, the
converter's own `tf.train.Example` descriptor against protoc's, and flat step values reshaped."""

from __future__ import annotations

import json
import sys
import re
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robowds.export.convert.rlds.features import Feature, episode_spans, read_features, step_values
from robowds.export.convert.rlds.records import (frame_record, masked_crc, parse_example, read_record,
                                                 scan_records)
from robowds.export.errors import UserError

from test_convert_rlds import example_pb2, version_dir

FIELD = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def reference_spans(is_first: list[bool], is_last: list[bool]) -> list[tuple[int, int]]:
    """RLDS read step by step: an is_first opens an episode (closing an open one), is_last closes it
    after its step; with no is_first anywhere the first step opens one."""
    spans, start = [], None
    for k in range(len(is_first)):
        if is_first[k]:
            if start is not None:
                spans.append((start, k))
            start = k
        elif start is None and k == 0 and not any(is_first):
            start = 0
        if start is not None and is_last[k]:
            spans.append((start, k + 1))
            start = None
    if start is not None:
        spans.append((start, len(is_first)))
    return spans


@given(st.integers(1, 24).flatmap(lambda n: st.tuples(st.lists(st.booleans(), min_size=n, max_size=n),
                                                      st.lists(st.booleans(), min_size=n, max_size=n))))
def test_episode_spans_follow_the_flags_step_by_step(flags: tuple[list[bool], list[bool]]) -> None:
    is_first, is_last = flags
    spans = episode_spans(np.array(is_first), np.array(is_last), len(is_first))
    assert spans == reference_spans(is_first, is_last)
    assert all(0 <= a < b <= len(is_first) for a, b in spans)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:]))


@given(st.integers(1, 30))
def test_a_record_without_flags_is_one_episode(steps: int) -> None:
    zeros = np.zeros(steps, np.int64)
    assert episode_spans(zeros, zeros, steps) == [(0, steps)] == episode_spans(None, None, steps)
    first = zeros.copy()
    first[0] = 1  # Bridge: is_first at step 0, is_last never
    assert episode_spans(first, zeros, steps) == [(0, steps)]


def test_masked_crc_is_tensorflows() -> None:
    """CRC32C("123456789") = 0xE3069283 (the standard check value), masked as TensorFlow's crc32c.h does."""
    crc = 0xE3069283
    assert masked_crc(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=6), st.data())
def test_framing_round_trips_and_any_flipped_byte_is_caught(tmp_path_factory: pytest.TempPathFactory,
                                                            payloads: list[bytes], data: st.DataObject) -> None:
    path = tmp_path_factory.mktemp("frames") / "x.tfrecord-00000-of-00001"
    blob = b"".join(frame_record(p) for p in payloads)
    path.write_bytes(blob)
    refs, problem = scan_records(path)
    assert problem is None and [read_record(path, r) for r in refs] == payloads
    if not blob:
        return
    at = data.draw(st.integers(0, len(blob) - 1))
    damaged = bytearray(blob)
    damaged[at] ^= data.draw(st.integers(1, 255))
    path.write_bytes(bytes(damaged))
    refs, problem = scan_records(path)
    read = []
    try:
        read = [read_record(path, r) for r in refs]
    except UserError as exc:
        assert f"{path}: record " in str(exc)
        return
    assert problem is not None and f"record {len(refs)} (byte " in problem  # never a silent wrong payload
    assert read == payloads[:len(refs)]


@settings(max_examples=30, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=12),
                       st.one_of(st.lists(st.floats(width=32, allow_nan=False), max_size=8).map(lambda v: ("f", *v)),
                                 st.lists(st.integers(-2**63, 2**63 - 1), max_size=8).map(lambda v: ("i", *v)),
                                 st.lists(st.binary(max_size=20), max_size=4).map(lambda v: ("b", *v))),
                       max_size=5))
def test_the_own_example_descriptor_parses_what_protoc_generated_code_writes(features: dict) -> None:
    example = example_pb2().Example()
    for key, (kind, *values) in features.items():
        target = example.features.feature[key]
        {"f": target.float_list, "i": target.int64_list, "b": target.bytes_list}[kind].value.extend(values)
    parsed = parse_example(example.SerializeToString(), "test")
    assert set(parsed) == set(features)
    for key, (kind, *values) in features.items():
        if kind == "b":
            assert parsed[key] == values
        else:
            assert parsed[key].dtype == (np.float32 if kind == "f" else np.int64)
            np.testing.assert_array_equal(parsed[key], np.array(values, parsed[key].dtype))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.lists(st.integers(1, 3), max_size=3), st.sampled_from(["float32", "int32", "uint8", "bool"]),
       st.sampled_from(["none", "bytes", "zlib"]), st.data())
def test_flat_step_values_reshape_to_steps_by_width(steps: int, shape: list[int], dtype: str, encoding: str,
                                                    data: st.DataObject) -> None:
    width = int(np.prod(shape))
    values = np.array(data.draw(st.lists(st.integers(0, 200), min_size=steps * width, max_size=steps * width)))
    source = values.astype(dtype).reshape(steps, *shape)  # [T, *shape], what the dataset held
    if encoding == "none":  # as TFDS writes it: float_list (float32) or int64_list, flattened over time
        flat = source.reshape(-1).astype(np.float32 if dtype == "float32" else np.int64)
    else:  # one raw tensor per step
        flat = [s.tobytes() if encoding == "bytes" else zlib.compress(s.tobytes()) for s in source]
    feature = Feature("steps/x", "x", True, "timeseries", dtype, tuple(shape), encoding)
    out = step_values(flat, feature, steps, "test")
    assert out.dtype == np.dtype(dtype) and out.shape == (steps, width)
    np.testing.assert_array_equal(out, source.reshape(steps, width))


def test_values_that_do_not_fit_the_steps_or_the_dtype_are_errors() -> None:
    feature = Feature("steps/x", "x", True, "timeseries", "int8", (3,), "none")
    with pytest.raises(UserError, match="has 7 values, not a multiple of 2 steps"):
        step_values(np.arange(7), feature, 2, "rec")
    with pytest.raises(UserError, match=r"holds 0..300, outside int8"):
        step_values(np.array([0, 1, 2, 3, 4, 300]), feature, 2, "rec")
    with pytest.raises(UserError, match="has 2 values per step, features.json says 3"):
        step_values(np.arange(4), feature, 2, "rec")


def test_bridge_features_map_to_these_fields() -> None:
    features = read_features(json.loads((version_dir() / "features.json").read_text()), "features.json")
    mapping = {f.key: (f.field, f.kind, f.dtype, f.shape) for f in features}
    assert mapping["steps/observation/state"] == ("observation_state", "timeseries", "float32", (7,))
    assert mapping["steps/observation/image_3"] == ("observation_image_3", "video", "uint8", (64, 64, 3))
    assert mapping["steps/is_last"] == ("is_last", "timeseries", "bool", ())
    assert mapping["steps/language_instruction"][:2] == ("language_instruction", "text")
    assert mapping["episode_metadata/episode_id"] == ("episode_episode_id", "value", "int32", ())
    assert len(mapping) == 20 and not any(f.problem for f in features)
    assert all(FIELD.match(f.field) for f in features) and len({f.field for f in features}) == 20


def test_clashing_and_reserved_names_get_distinct_fields() -> None:
    leaf = {"pythonClassName": "x.Scalar", "tensor": {"shape": {}, "dtype": "float32", "encoding": "none"}}
    steps = {"sequence": {"feature": {"featuresDict": {"features": {"a.b": leaf, "a_b": leaf, "split": leaf}}}}}
    spec = {"featuresDict": {"features": {"steps": steps, "episode_id": leaf}}}
    fields = {f.key: f.field for f in read_features(spec, "f.json")}
    assert fields == {"episode_id": "episode_id_2", "steps/a.b": "a_b", "steps/a_b": "a_b_2", "steps/split": "split_2"}


def test_a_folder_without_a_steps_sequence_is_not_rlds() -> None:
    with pytest.raises(UserError, match="not an RLDS dataset: features.json has no `steps` sequence"):
        read_features({"featuresDict": {"features": {"image": {"image": {}}}}}, "f.json")


def test_the_real_shard_scans_to_25_records_with_checked_headers() -> None:
    path = version_dir() / "bridge_dataset-train.tfrecord-00000-of-00001"
    refs, problem = scan_records(path)
    assert problem is None and len(refs) == 25 and refs[0].offset == 0
    assert sum(16 + r.length for r in refs) == path.stat().st_size


@pytest.mark.parametrize("module,needs", [("google_crc32c", "google-crc32c"), ("google.protobuf", "protobuf")])
def test_a_missing_package_is_one_error_naming_it(monkeypatch: pytest.MonkeyPatch, module: str, needs: str) -> None:
    from robowds.export.convert.rlds.records import example_class

    monkeypatch.setitem(sys.modules, module, None)  # `import` raises ImportError
    example_class.cache_clear()
    try:
        with pytest.raises(UserError, match=f"needs the {needs} package") as caught:
            frame_record(b"x") if module == "google_crc32c" else example_class()
        assert "pip install 'robowds[convert]'" in str(caught.value)
    finally:
        example_class.cache_clear()
