"""Every bad export-config value is one error line and one fix line (docs/cli.md, "Errors").

One table of bad values, covering every key docs/export-config.md documents (a bad type and a bad
range), unknown keys, a bad `--config` file, bad `--set` items and fields the store lacks, each run
through the real CLI (`robowds export STORE OUT ...`, in-process) on one small synthetic store. For
each: exit code 2, stderr is exactly `robowds export: error: ...` naming the key, the bad value and
where it was set, then `  fix: ...` with what the key takes and a line that works; no traceback, and
OUT is never created (the config is refused before any work).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import robowds.export
from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.job.config_check import MAPPING_RULES, SHARD_RULES, STREAM_RULES, TOP_RULES

POSITIVE = "must be a positive number"
SPLIT = "must be a fraction in [0, 1], a list of episode ids or rest"

# (id, command-line options ({cfg}: the config file), config file text, parts of the error line, parts of the fix line)
CASES = [
    ("fps negative", ["--set", "fps=-10"], None, ["config fps", POSITIVE, "got -10", "(from --set fps=-10)"],
     ["give fps a positive number (grid frames per second)", "e.g. --set fps=10"]),
    ("fps zero", ["--set", "fps=0"], None, ["config fps", POSITIVE, "got 0"], ["--set fps=10"]),
    ("fps a word", ["--set", "fps=ten"], None, ["config fps", POSITIVE, "got 'ten'"], ["--set fps=10"]),
    ("fps infinite", ["--set", "fps=.inf"], None, ["config fps", POSITIVE, "got inf"], ["--set fps=10"]),
    ("--fps flag negative", ["--fps", "-10"], None, ["config fps", POSITIVE, "got -10.0 (from --fps -10)"],
     ["--set fps=10"]),
    ("--stride flag zero", ["--stride", "0"], None, ["config stride", "got 0 (from --stride 0)"], ["--set stride=2"]),
    ("stride zero", ["--set", "stride=0"], None, ["config stride must be an integer >= 1, got 0"],
     ["(an anchor every N grid frames)", "--set stride=2"]),
    ("stride fraction", ["--set", "stride=1.5"], None, ["config stride must be an integer >= 1, got 1.5"],
     ["--set stride=2"]),
    ("seed negative", ["--set", "seed=-1"], None, ["config seed must be an integer >= 0, got -1"], ["--set seed=0"]),
    ("seed a word", ["--set", "seed=abc"], None, ["config seed must be an integer >= 0, got 'abc'"],
     ["--set seed=0"]),
    ("min_valid_fraction above 1", ["--set", "min_valid_fraction=1.5"], None,
     ["config min_valid_fraction must be a number in [0, 1], got 1.5"], ["--set min_valid_fraction=0.5"]),
    ("max_gap_factor negative", ["--set", "max_gap_factor=-1"], None, ["config max_gap_factor", POSITIVE, "got -1"],
     ["--set max_gap_factor=2.5"]),
    ("max_episode_s zero", ["--set", "max_episode_s=0"], None,
     ["config max_episode_s must be a positive number of seconds, got 0"], ["--set max_episode_s=86400"]),
    ("shuffle a word", ["--set", "shuffle=maybe"], None, ["config shuffle must be true or false, got 'maybe'"],
     ["--set shuffle=false"]),
    ("include a string", ["--set", "include=joints"], None,
     ["config include must be a list of field names, or null for every field, got 'joints'"],
     ["--set 'include=[joints, imu]'"]),
    ("exclude null", ["--set", "exclude=null"], None, ["config exclude must be a list of field names, got None"],
     ["--set 'exclude=[imu]'"]),
    ("timestamps unknown", ["--set", "timestamps=fix"], None,
     ["config timestamps must be one of repair, reject, got 'fix'"], ["--set timestamps=reject"]),
    ("float_dtype float16", ["--set", "float_dtype=float16"], None,
     ["config float_dtype must be one of float32, float64, got 'float16'"], ["--set float_dtype=float64"]),
    ("on_bad_episode unknown", ["--set", "on_bad_episode=ignore"], None,
     ["config on_bad_episode must be one of fail, skip, got 'ignore'"], ["--set on_bad_episode=skip"]),
    ("window not a mapping", ["--set", "window=5"], None, ["config window must be a mapping of window keys, got 5"],
     ["--set 'window={duration_s: 2.0, pad: edge}'"]),
    ("window.duration_s a word", ["--set", "window.duration_s=abc"], None,
     ["config window.duration_s", POSITIVE, "got 'abc'"], ["(seconds)", "--set window.duration_s=1.0"]),
    ("window.duration_s null", ["--set", "window.duration_s=null"], None,
     ["config window.duration_s", POSITIVE, "got None"], ["--set window.duration_s=1.0"]),
    ("window.duration_s not whole steps", ["--set", "window.duration_s=0.15"], None,
     ["config window.duration_s is 0.15 s, which at fps 10 Hz is 1.5 steps of field 'actions'",
      "not a whole number of steps"],
     ["a multiple of 1/10 s", "--set window.duration_s=0.2"]),
    ("window.rate_hz zero", ["--set", "window.rate_hz=0"], None, ["config window.rate_hz", POSITIVE, "got 0"],
     ["(Hz; null: fps)", "--set window.rate_hz=50"]),
    ("window.offset_s a word", ["--set", "window.offset_s=soon"], None,
     ["config window.offset_s must be a number, got 'soon'"], ["negative: history", "--set window.offset_s=-0.5"]),
    ("window.pad unknown", ["--set", "window.pad=mirror"], None, ["config window.pad must be zero or edge, got 'mirror'"],
     ["--set window.pad=edge"]),
    ("max_gap_s negative", ["--set", "streams.joints.max_gap_s=-1"], None,
     ["config streams.joints.max_gap_s", POSITIVE, "got -1"], ["--set streams.joints.max_gap_s=0.5"]),
    ("interpolation unknown", ["--set", "streams.joints.interpolation=cubic"], None,
     ["config streams.joints.interpolation must be one of linear", "got 'cubic'"],
     ["--set streams.joints.interpolation=hold"]),
    ("dtype int8", ["--set", "streams.joints.dtype=int8"], None,
     ["config streams.joints.dtype must be one of float32, float64, got 'int8'"],
     ["--set streams.joints.dtype=float64"]),
    ("streams not a mapping", ["--set", "streams=[]"], None,
     ["config streams must be a mapping of field name -> window keys, got []"],
     ["--set 'streams={joints: {rate_hz: 50}}'"]),
    ("stream pad unknown", ["--set", "streams.joints.pad=foo"], None,
     ["config streams.joints.pad must be zero or edge, got 'foo'"], ["--set streams.joints.pad=edge"]),
    ("stream not a mapping", ["--set", "streams.joints=5"], None,
     ["config streams.joints must be a mapping of window keys, got 5"], ["--set 'streams.joints={rate_hz: 50}'"]),
    ("stream key unknown", ["--set", "streams.joints.rate=50"], None,
     ["unknown key(s) ['rate'] in config streams.joints (from --set streams.joints.rate=50)"],
     ["did you mean streams.joints.rate_hz?"]),
    ("encoding unknown", ["--set", "streams.overview.encoding=gif"], None,
     ["config streams.overview.encoding must be one of", "got 'gif'"], ["--set streams.overview.encoding=jpg"]),
    ("resize zero", ["--set", "streams.overview.resize=[0, 224]"], None,
     ["config streams.overview.resize must be [width, height] in pixels, got [0, 224]"],
     ["--set 'streams.overview.resize=[224, 224]'"]),
    ("crop a word", ["--set", "streams.overview.crop=middle"], None,
     ["config streams.overview.crop must be null, \"center\"", "got 'middle'"],
     ["--set streams.overview.crop=center"]),
    ("selection unknown", ["--set", "streams.overview.selection=random"], None,
     ["config streams.overview.selection must be nearest or causal, got 'random'"],
     ["--set streams.overview.selection=causal"]),
    ("video encoding on an image", ["--set", "streams.overview.encoding=mp4"], None,
     ["config streams.overview.encoding is 'mp4', but 'overview' is an image field"], ["image encodings: "]),
    ("crop center without resize", ["--set", "streams.overview.encoding=png", "--set", "streams.overview.crop=center"],
     None, ['config streams.overview.crop is "center" but streams.overview.resize is not set'],
     ["resize: [width, height]"]),
    ("window keys on a text field", ["--set", "streams.task.rate_hz=5"], None,
     ["config streams.task sets ['rate_hz'], but 'task' is a text field"], ["remove streams.task"]),
    ("video keys on a time series", ["--set", "streams.joints.encoding=mp4"], None,
     ["config streams.joints sets ['encoding'], but 'joints' is a time series"], ["a time series takes only"]),
    ("shard not a mapping", ["--set", "shard=5"], None, ["config shard must be a mapping of shard keys, got 5"],
     ["--set 'shard={max_samples: 1000}'"]),
    ("shard.max_samples zero", ["--set", "shard.max_samples=0"], None,
     ["config shard.max_samples must be an integer >= 1, got 0"],
     ["(windows per shard)", "--set shard.max_samples=4096"]),
    ("shard.max_bytes small", ["--set", "shard.max_bytes=100"], None,
     ["config shard.max_bytes must be an integer >= 4096, got 100"], ["--set shard.max_bytes=256e6"]),
    ("shard.min_shards zero", ["--set", "shard.min_shards=0"], None,
     ["config shard.min_shards must be an integer >= 1, got 0"], ["--set shard.min_shards=8"]),
    ("shard.layout unknown", ["--set", "shard.layout=zip"], None,
     ["config shard.layout must be one of members, npz, got 'zip'"], ["--set shard.layout=npz"]),
    ("splits not a mapping", ["--set", "splits=rest"], None, ["config splits must be a mapping", "got 'rest'"],
     ["--set 'splits={train: rest, val: 0.1}'"]),
    ("split fraction above 1", ["--set", "splits={train: 2.0}"], None,
     ["config splits.train " + SPLIT + ", got 2.0", "(from --set splits={train: 2.0})"],
     ["--set splits.train=rest"]),
    ("split fraction negative", ["--set", "splits.val=-0.1"], None, ["config splits.val " + SPLIT + ", got -0.1"],
     ["--set splits.val=0.1"]),
    ("split rule a word", ["--set", "splits.val=half"], None, ["config splits.val " + SPLIT + ", got 'half'"],
     ["--set splits.val=0.1"]),
    ("no rest split", ["--set", "splits.train=0.8"], None,
     ["config splits must be a mapping that names exactly one split as 'rest'", "got {'train': 0.8}"],
     ["--set 'splits={train: rest, val: 0.1}'"]),
    ("two rest splits", ["--set", "splits.val=rest"], None,
     ["exactly one split as 'rest'", "got {'train': 'rest', 'val': 'rest'}"], ["{train: rest, val: 0.1}"]),
    ("split fractions above 1", ["--set", "splits={train: rest, a: 0.7, b: 0.6}"], None,
     ["config splits must be fractions that add up to at most 1", "'a': 0.7"], ["(these add up to 1.3)"]),
    ("split names an episode the store lacks", ["--set", "splits.val=[nope]"], None,
     ["config splits.val names episode 'nope', which the store does not have"], ["e.g. ep_0000, ep_0001"]),
    ("unknown top-level key", ["--set", "fpss=10"], None, ["unknown config key 'fpss' in --set fpss=10"],
     ["did you mean fps?"]),
    ("unknown nested key", ["--set", "window.durtion_s=1"], None,
     ["unknown config key 'window.durtion_s' in --set window.durtion_s=1"], ["did you mean window.duration_s?"]),
    ("include names a field the store lacks", ["--set", "include=[nope]"], None,
     ["config include names field(s) the store does not have: ['nope']"], ["actions, gripper_cmd, imu, joints"]),
    ("streams names a field the store lacks", ["--set", "streams.nope.rate_hz=5"], None,
     ["config streams names field(s) the store does not have: ['nope']"], ["actions, gripper_cmd, imu, joints"]),
    ("no field selected", ["--set", "include=[]"], None, ["config include/exclude select no field to export"],
     ["--set include=null"]),
    ("--set without =", ["--set", "fps"], None, ["override 'fps' is not KEY=VALUE"], ["e.g. --set"]),
    ("--set value not YAML", ["--set", "fps=[1,"], None, ["--set fps=[1,: the value is not valid YAML"],
     ["quote it"]),
    ("--config not YAML", ["--config", "{cfg}"], "fps: [1, 2\n", ["cannot read config", "export.yaml"],
     ["YAML text file"]),
    ("--config a list", ["--config", "{cfg}"], "- fps\n", ["export.yaml must be a YAML mapping"], ["`fps: 10`"]),
    ("--config value", ["--config", "{cfg}"], "fps: 10\nwindow: {pad: mirror}\n",
     ["config window.pad must be zero or edge, got 'mirror' (from ", "export.yaml)"],
     ["e.g. `window: {pad: edge}` in ", "export.yaml"]),
    ("--set after --config names the --set", ["--config", "{cfg}", "--set", "fps=-1"], "fps: 5\n",
     ["got -1 (from --set fps=-1)"], ["--set fps=10"]),
]


def test_the_table_sets_every_key_the_config_checks() -> None:
    """A key with a rule in config_check.py and no bad value in CASES is a gap in this test."""
    items = [o.partition("=")[0] for case in CASES for o in case[1] if "=" in o]
    keys = [*MAPPING_RULES, *TOP_RULES, *(f"shard.{k}" for k in SHARD_RULES)]
    assert [k for k in keys if k not in items] == []
    assert [k for k in STREAM_RULES if not any(i.startswith(("window.", "streams.")) and i.endswith("." + k)
                                               for i in items)] == []


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_store(tmp_path_factory.mktemp("config-errors") / "store", episodes=2, seed=0).root


@pytest.mark.parametrize("options, text, line_parts, fix_parts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_config_value_is_one_error_line_and_one_fix_line(
        options: list[str], text: str | None, line_parts: list[str], fix_parts: list[str], store: Path,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "export.yaml"
    if text is not None:
        config.write_text(text)
    out = tmp_path / "out"
    argv = ["export", str(store), str(out), "--quiet", "--workers", "1",
            *(str(config) if o == "{cfg}" else o for o in options)]
    rc = main(argv)  # an exception escaping here is the traceback a user would see: the test fails with it
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == "", (rc, captured)
    lines = captured.err.split("\n")
    assert len(lines) == 3 and lines[2] == "", captured.err  # the error line, the fix line, the final newline
    error, fix = lines[:2]
    assert error.startswith("robowds export: error: ") and fix.startswith("  fix: "), captured.err
    assert "Traceback" not in captured.err
    for part in line_parts:
        assert part in error, f"{part!r} not in the error line:\n{error}"
    for part in fix_parts:
        assert part in fix, f"{part!r} not in the fix line:\n{fix}"
    assert not out.exists()  # refused before OUT was touched: nothing published, nothing to clean up


EXPORT = Path(robowds.export.__file__).parent  # the package under test (its source files)
# the user errors: UserError's own arguments are (message, hint, ...), EpisodeError's (episode, field, message, hint)
HINT_POSITION = {"UserError": 1, "EpisodeError": 3, "DiskSpaceError": 1}


def user_errors_without_a_fix(folder: Path) -> list[str]:
    """`file:line` of every UserError (or subclass) built without a hint in the package's source,
    read with `ast` (multi-line calls included; no import side effects)."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            if name in HINT_POSITION and not (len(node.args) > HINT_POSITION[name]
                                              or any(k.arg in ("hint", None) for k in node.keywords)):
                found.append(f"{path.relative_to(folder)}:{node.lineno}")
    return found


def test_every_user_error_has_a_fix() -> None:
    """No user error in export/ can be raised without its fix line (config values go through
    `config_error`, whose example is required): a new `raise UserError("...")` fails here."""
    assert user_errors_without_a_fix(EXPORT) == []


@pytest.mark.parametrize("argv, message", [
    (["export", "STORE", "OUT", "--fps", "abc"], "robowds export: error: argument --fps: invalid float value: 'abc'"),
    (["export", "STORE"], "robowds export: error: the following arguments are required: out"),
    (["export", "STORE", "OUT", "--fsp", "5"], "robowds: error: unrecognized arguments: --fsp 5"),
    (["convert", "lerobot", "SRC"], "robowds convert lerobot: error: the following arguments are required: store"),
])
def test_a_usage_error_is_one_error_line_and_one_fix_line(argv: list[str], message: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """argparse's own errors take the same shape (its usage block used to come first, with no fix)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    prog = message.split(": error:")[0]
    assert exc.value.code == 2
    assert capsys.readouterr().err == f"{message}\n  fix: `{prog} --help` lists every option and the values it takes\n"
