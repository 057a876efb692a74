"""Tests for the export configuration (export/job/config.py): defaults, YAML, --set overrides, validation."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from robowds.export.core.windows import StreamWindow
from robowds.export.errors import UserError
from robowds.export.job.config import DEFAULTS, load_config, stream_window


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "export.yaml"
    path.write_text(text)
    return path


# --- defaults, file, overrides ---

def test_defaults() -> None:
    config = load_config(None)
    assert config == DEFAULTS
    assert config["fps"] == 10.0 and config["stride"] == 1 and config["shuffle"] is True
    assert config["window"] == {"duration_s": 1.0, "offset_s": 0.0, "rate_hz": None, "pad": "zero"}
    assert config["splits"] == {"train": "rest"}
    assert config["shard"] == {"max_samples": 4096, "max_bytes": 256 * 1024 * 1024, "min_shards": 8}


def test_defaults_are_not_shared() -> None:
    before = copy.deepcopy(DEFAULTS)
    config = load_config(None, ["streams.joints.rate_hz=50"])
    config["window"]["pad"] = "edge"
    config["exclude"].append("x")
    assert DEFAULTS == before
    assert load_config(None)["streams"] == {}


def test_yaml_file_is_deep_merged(tmp_path: Path) -> None:
    path = _yaml(tmp_path, """
fps: 30
window: {duration_s: 2.0}
streams:
  joints: {rate_hz: 50, pad: edge}
shard: {max_samples: 100}
splits: {train: 0.9, val: rest}
""")
    config = load_config(path)
    assert config["fps"] == 30
    assert config["window"] == {"duration_s": 2.0, "offset_s": 0.0, "rate_hz": None, "pad": "zero"}
    assert config["streams"] == {"joints": {"rate_hz": 50, "pad": "edge"}}
    assert config["shard"] == {"max_samples": 100, "max_bytes": 256 * 1024 * 1024, "min_shards": 8}
    assert config["splits"] == {"train": 0.9, "val": "rest"}
    assert config["seed"] == 0  # untouched defaults stay


def test_empty_yaml_file_gives_defaults(tmp_path: Path) -> None:
    assert load_config(_yaml(tmp_path, "")) == DEFAULTS


@pytest.mark.parametrize("item, path, value", [
    ("streams.joints.rate_hz=50", ("streams", "joints", "rate_hz"), 50.0),  # real-valued keys become floats
    ("shuffle=false", ("shuffle",), False),
    ("fps=12.5", ("fps",), 12.5),
    ("seed=7", ("seed",), 7),
    ("window.offset_s=-0.5", ("window", "offset_s"), -0.5),
    ("window.rate_hz=null", ("window", "rate_hz"), None),
    ("include=[joints, cam_high]", ("include",), ["joints", "cam_high"]),
    ("splits.val=[ep_1, 2]", ("splits", "val"), ["ep_1", 2]),
    ("streams.joints.pad=edge", ("streams", "joints", "pad"), "edge"),
])
def test_set_overrides_are_yaml_typed(item: str, path: tuple[str, ...], value: object) -> None:
    node = load_config(None, [item])
    for part in path:
        node = node[part]
    assert node == value and type(node) is type(value)


def test_spellings_of_one_number_are_one_config(tmp_path: Path) -> None:
    """`--fps 5` (a float), `--set fps=5` (an int) and `fps: 5` in a file gave different job ids, so a
    re-run with another spelling was refused as "a different config"."""
    from robowds.export.cli.main import main
    from robowds.export.cli.synth import write_synthetic_store

    a = load_config(None, ["fps=5", "window.duration_s=1", "streams.imu.offset_s=-1", "min_valid_fraction=0"])
    b = load_config(_yaml(tmp_path, "fps: 5.0\nwindow: {duration_s: 1.0}\nstreams: {imu: {offset_s: -1.0}}\n"),
                    ["min_valid_fraction=0.0"])
    assert a == b and repr(a) == repr(b)
    store, out = tmp_path / "s", tmp_path / "out"
    write_synthetic_store(store, episodes=2, seed=0)
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--set", "fps=5"]) == 0
    before = (out / "manifest.json").read_bytes()
    assert main(["export", str(store), str(out), "--workers", "1", "--fps", "5"]) == 0  # up to date, no refusal
    assert (out / "manifest.json").read_bytes() == before


def test_overrides_apply_after_the_file_and_in_order(tmp_path: Path) -> None:
    path = _yaml(tmp_path, "fps: 30\nstreams: {joints: {rate_hz: 50}}\n")
    config = load_config(path, ["fps=20", "streams.joints.duration_s=0.5", "fps=15"])
    assert config["fps"] == 15
    assert config["streams"]["joints"] == {"rate_hz": 50, "duration_s": 0.5}


def test_override_value_may_contain_equals() -> None:
    assert load_config(None, ["splits.val=[a=b]"])["splits"]["val"] == ["a=b"]


@pytest.mark.parametrize("item", ["fps", "=3", ""])
def test_malformed_override_is_a_user_error(item: str) -> None:
    with pytest.raises(UserError, match="is not KEY=VALUE"):
        load_config(None, [item])


# --- unknown keys ---

def test_unknown_top_level_key_in_override() -> None:
    with pytest.raises(UserError, match="unknown config key 'fpss'") as exc:
        load_config(None, ["fpss=10"])
    assert "--set fpss=10" in str(exc.value)


def test_unknown_top_level_key_in_file(tmp_path: Path) -> None:
    path = _yaml(tmp_path, "fps: 10\nshufle: false\n")
    with pytest.raises(UserError, match="unknown config key 'shufle'") as exc:
        load_config(path)
    assert str(path) in str(exc.value)


@pytest.mark.parametrize("item, name", [("window.durtion_s=1", "window.durtion_s"),
                                        ("shard.max_sample=3", "shard.max_sample")])
def test_unknown_nested_key(item: str, name: str) -> None:
    with pytest.raises(UserError, match=f"unknown config key '{name}'"):
        load_config(None, [item])


def test_unknown_stream_key() -> None:
    with pytest.raises(UserError, match=r"unknown key\(s\) \['rate'\] in config streams.joints"):
        load_config(None, ["streams.joints.rate=50"])


def test_unknown_stream_key_in_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="streams.cam"):
        load_config(_yaml(tmp_path, "streams: {cam: {rate_hz: 5, padding: edge}}\n"))


def test_stream_must_be_a_mapping() -> None:
    with pytest.raises(UserError, match="streams.joints must be a mapping"):
        load_config(None, ["streams.joints=5"])


def test_unreadable_or_non_mapping_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(UserError, match="cannot read config"):
        load_config(_yaml(tmp_path, "fps: [1, 2\n"))
    with pytest.raises(UserError, match="must be a YAML mapping"):
        load_config(_yaml(tmp_path, "- 1\n- 2\n"))


# --- bad values ---

@pytest.mark.parametrize("item, message", [
    ("fps=0", "fps must be a positive number"),
    ("fps=-10", "fps must be a positive number"),
    ("fps=.inf", "fps must be a positive number"),
    ("fps=ten", "fps must be a positive number"),
    ("fps=true", "fps must be a positive number"),
    ("stride=0", "stride must be an integer >= 1"),
    ("stride=1.5", "stride must be an integer >= 1"),
    ("min_valid_fraction=1.5", "min_valid_fraction"),
    ("window.pad=foo", "pad must be zero or edge"),
    ("streams.joints.pad=foo", "streams.joints.pad must be zero or edge"),
    ("splits.val=rest", "exactly one split as 'rest'"),
    ("splits.train=0.8", "exactly one split as 'rest'"),
    ("timestamps=fix", "timestamps must be one of repair, reject"),
    ("float_dtype=float16", "float_dtype"),
    ("on_bad_episode=ignore", "on_bad_episode"),
    ("shard.max_samples=0", "shard.max_samples"),
    ("shard.max_bytes=100", "shard.max_bytes"),
    ("shard.min_shards=0", "shard.min_shards must be an integer >= 1"),
])
def test_bad_value_is_a_user_error(item: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        load_config(None, [item])


@pytest.mark.parametrize("item", [
    "min_valid_fraction=abc",  # ValueError from float()
    "shard.max_samples=abc",  # ValueError from int()
    "shard=5",  # TypeError: 'int' object is not subscriptable
    "streams=[]",  # TypeError: 'list' object is not a mapping
    "stride=true",  # accepted as stride 1 (bool is an int)
    "shuffle=maybe",  # accepted: a non-empty string is truthy
    "seed=abc",  # accepted
    "max_gap_factor=-1",  # accepted: masks every interpolated step
])
def test_badly_typed_value_is_a_user_error(item: str) -> None:
    with pytest.raises(UserError):
        load_config(None, [item])


def test_splits_without_train_in_file(tmp_path: Path) -> None:
    config = load_config(_yaml(tmp_path, "splits: {val: 0.1, holdout: rest}\n"))
    assert config["splits"] == {"val": 0.1, "holdout": "rest"}


def test_two_rest_splits_in_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="exactly one split as 'rest'"):
        load_config(_yaml(tmp_path, "splits: {train: rest, val: rest}\n"))


# --- stream_window ---

def test_stream_window_defaults_to_fps() -> None:
    config = load_config(None)
    assert stream_window(config, "joints", "linear", None) == StreamWindow(
        rate_hz=10.0, duration_s=1.0, offset_s=0.0, pad="zero", steps=10, max_gap_s=None, interpolation="linear")


def test_stream_window_steps_are_duration_times_rate() -> None:
    config = load_config(None, ["streams.joints.rate_hz=50", "streams.joints.duration_s=0.1",
                                "streams.joints.offset_s=-0.04"])
    w = stream_window(config, "joints", "linear", None)
    assert (w.rate_hz, w.duration_s, w.offset_s, w.steps) == (50.0, 0.1, -0.04, 5)
    assert isinstance(w.rate_hz, float) and isinstance(w.steps, int)


@pytest.mark.parametrize("rate, duration, steps", [(30, 0.1, 3), (15, 2.0, 30), (3, 1 / 3, 1), (1000, 0.25, 250)])
def test_stream_window_float_products_round_to_steps(rate: float, duration: float, steps: int) -> None:
    config = load_config(None, [f"window.rate_hz={rate}", f"window.duration_s={duration!r}"])
    assert stream_window(config, "x", "hold", None).steps == steps


@pytest.mark.parametrize("overrides", [["window.duration_s=0.15"], ["streams.j.rate_hz=7", "streams.j.duration_s=0.5"],
                                       ["window.duration_s=0.01"]])
def test_non_integer_steps_is_a_user_error(overrides: list[str]) -> None:
    config = load_config(None, overrides)
    with pytest.raises(UserError, match="not a whole number of steps"):
        stream_window(config, "j", "linear", None)


@pytest.mark.parametrize("item", ["window.duration_s=0", "window.rate_hz=-5", "streams.j.duration_s=-1"])
def test_non_positive_rate_or_duration_is_a_user_error(item: str) -> None:
    with pytest.raises(UserError, match="must be a positive number"):
        stream_window(load_config(None, [item]), "j", "linear", None)


def test_per_stream_overrides_window_defaults() -> None:
    config = load_config(None, ["window.duration_s=2", "window.pad=edge", "window.offset_s=-1",
                                "streams.actions.rate_hz=50", "streams.actions.offset_s=0",
                                "streams.actions.interpolation=hold", "streams.actions.max_gap_s=0.2"])
    actions = stream_window(config, "actions", "linear", 0.5)
    assert actions == StreamWindow(rate_hz=50.0, duration_s=2.0, offset_s=0.0, pad="edge", steps=100,
                                   max_gap_s=0.2, interpolation="hold")
    other = stream_window(config, "joints", "linear", 0.5)  # window defaults + the declared max gap
    assert other == StreamWindow(rate_hz=10.0, duration_s=2.0, offset_s=-1.0, pad="edge", steps=20,
                                 max_gap_s=0.5, interpolation="linear")


# --- numbers with an exponent (YAML 1.1 reads 1e-1 as a string) ---

@pytest.mark.parametrize("raw, value", [("1e-1", 0.1), ("1E1", 10.0), ("+2.5e1", 25.0), (".5e1", 5.0),
                                        ("5e0", 5.0), ("1.5e1", 15.0)])
def test_exponent_numbers_in_set_are_numbers(raw: str, value: float) -> None:
    config = load_config(None, [f"fps={raw}", f"window.duration_s={raw}"])
    assert config["fps"] == value and config["window"]["duration_s"] == value


def test_exponent_numbers_in_the_config_file_are_numbers(tmp_path: Path) -> None:
    config = load_config(_yaml(tmp_path, "fps: 2e1\nstreams:\n  joints:\n    max_gap_s: 5e-2\n"))
    assert config["fps"] == 20.0 and config["streams"]["joints"]["max_gap_s"] == 0.05


def test_an_exponent_makes_a_float_whole_ones_count_as_integers_and_words_stay_strings() -> None:
    config = load_config(None, ["seed=1e3", "shard.max_bytes=2.56e8"])
    assert config["seed"] == 1000 and config["shard"]["max_bytes"] == 256_000_000
    assert type(config["seed"]) is int and config == load_config(None, ["seed=1000", "shard.max_bytes=256000000"])
    with pytest.raises(UserError, match=r"config seed must be an integer >= 0, got 1.5"):
        load_config(None, ["seed=1.5e0"])
    with pytest.raises(UserError, match=r"config fps must be a positive number, got 'e5'"):
        load_config(None, ["fps=e5"])
    assert load_config(None, ["splits.val=1e-1"])["splits"] == {"train": "rest", "val": 0.1}
