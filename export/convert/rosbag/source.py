"""Opening ROS bags with `rosbags` (AnyReader), and what the plan reads from them before any episode
is converted: the bags under SRC, their topics and types, a topic's first message, receive times.

Every reader failure becomes one UserError naming the bag (and the episode where there is one), with
a fix: rosbags raises its own error types, and a damaged file also surfaces as OSError (a bad bz2 or
zstd chunk), struct/Value/IndexError or an assertion inside the reader, so reading is wrapped here and
nowhere else.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from robowds.export.errors import UserError

ROS2_FILES = (".mcap", ".db3")  # a ROS 2 storage file opened without its folder's metadata.yaml
INSTALL = "pip install 'robowds[convert]' (or: pip install rosbags)"


@dataclass(frozen=True)
class Bag:
    """One recording under SRC: a ROS 1 `.bag` file, a ROS 2 bag folder (metadata.yaml) or a bare
    `.mcap` / `.db3` file; `name` is its path relative to SRC without the suffix (the episode id)."""

    path: Path
    name: str


def find_bags(src: Path) -> list[Bag]:
    """The bags SRC names: itself (a bag file or a ROS 2 bag folder), or every bag under a folder,
    in path order (a ROS 2 bag folder is one bag; its storage files are not listed again)."""
    if not src.exists():
        raise UserError(f"{src} does not exist", hint="pass a .bag file, a ROS 2 bag folder, or a folder of bags")
    if _is_bag(src):
        return [Bag(src, src.stem if src.is_file() else src.name)]
    if src.is_file():
        raise UserError(f"{src} is not a ROS bag: expected a ROS 1 .bag file, a ROS 2 bag folder (with "
                        "metadata.yaml), an .mcap or .db3 file, or a folder of those",
                        hint="pass the bag itself, or the folder that holds the bags")
    bags = sorted(_walk(src, set()))
    if not bags:
        raise UserError(f"{src}: no ROS bag found (no .bag, .mcap, .db3 file, no folder with metadata.yaml)",
                        hint="pass a bag, or the folder that holds the bags")
    names = [(p.relative_to(src).with_suffix("") if p.is_file() else p.relative_to(src)).as_posix() for p in bags]
    # x.bag next to x.mcap (or a ROS 2 folder x): those keep their suffix, so every episode id is distinct
    return [Bag(p, n if names.count(n) == 1 else p.relative_to(src).as_posix()) for p, n in zip(bags, names)]


def _walk(folder: Path, seen: set[Path]) -> list[Path]:
    """The bags under `folder`, following linked folders (each real folder once: no loops); a ROS 2 bag
    folder is one bag, its storage files are not listed again."""
    real = folder.resolve()
    if real in seen:
        return []
    seen.add(real)
    out = []
    for path in sorted(folder.iterdir()):
        if _is_bag(path):
            out.append(path)
        elif path.is_dir():
            out.extend(_walk(path, seen))
    return out


def _is_bag(path: Path) -> bool:
    return (path.is_file() and path.suffix in (".bag", *ROS2_FILES)) or (path / "metadata.yaml").is_file()


def _anyreader() -> Any:  # noqa: ANN401 (the rosbags module)
    try:
        from rosbags import highlevel
    except ImportError as exc:
        raise UserError("robowds convert rosbag needs the `rosbags` package", hint=INSTALL) from exc
    return highlevel


def damaged(bag: Path, exc: BaseException, episode: str | None = None, topic: str | None = None) -> UserError:
    """The one message for a bag that cannot be read."""
    where = f"episode {episode!r}: " if episode else ""
    where += f"{bag}" + (f", topic {topic}" if topic else "")
    reason = f"{type(exc).__name__}: {exc}".strip() if str(exc) else type(exc).__name__
    repair = ("a ROS 1 bag whose recording was killed needs `rosbag reindex` first" if bag.suffix == ".bag" else
              "an MCAP file whose recording was killed can be repaired with `mcap recover`")
    hint = f"the file is damaged or truncated: copy it again; {repair}"
    if episode:
        hint += "; or pass --skip-bad to convert the other episodes"
    return UserError(f"{where}: cannot read the bag ({reason})", hint=hint)


@contextmanager
def open_bag(bag: Path, typestore: str, episode: str | None = None) -> Iterator[Any]:
    """An open AnyReader on one bag. `typestore`: rosbags' store name for ROS 2 bags that embed no
    message definitions (ROS 1 bags and MCAP files always embed theirs)."""
    highlevel = _anyreader()
    from rosbags.typesys import Stores, get_typestore

    try:
        kind = Stores(typestore)
    except ValueError as exc:
        raise UserError(f"unknown typestore {typestore!r}",
                        hint=f"one of {', '.join(s.value for s in Stores if s.value != 'empty')}") from exc
    store = get_typestore(kind) if bag.suffix != ".bag" else None  # ROS 1 bags always embed definitions
    reader = highlevel.AnyReader([bag], default_typestore=store)
    try:
        reader.open()
    except Exception as exc:  # noqa: BLE001 (any failure to open is a damaged or foreign file)
        raise damaged(bag, exc, episode) from exc
    try:
        yield reader
    finally:
        reader.close()


@contextmanager
def open_index(bag: Path) -> Iterator[Any]:
    """An open rosbags reader without a type store (connections and receive times only: a ROS 1 bag's
    index, a ROS 2 bag's metadata and summary), cheaper than `open_bag` for the plan's inventory."""
    _anyreader()
    from rosbags.rosbag1 import Reader as Reader1
    from rosbags.rosbag2 import Reader as Reader2

    try:
        reader = (Reader1 if bag.suffix == ".bag" else Reader2)(bag)
        reader.open()
    except Exception as exc:  # noqa: BLE001 (any failure to open is a damaged or foreign file)
        raise damaged(bag, exc) from exc
    try:
        yield reader
    finally:
        reader.close()


def listed_topics(bag: Path) -> dict[str, str] | None:
    """{topic: type} from a ROS 2 bag folder's metadata.yaml (PyYAML's C loader: rosbags' own open parses
    it, and each topic's QoS text, with a pure-Python YAML library, ~80 ms a bag); None for other bags."""
    meta = bag / "metadata.yaml"
    if not meta.is_file():
        return None
    import yaml

    try:
        info = yaml.load(meta.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        entries = info["rosbag2_bagfile_information"]["topics_with_message_count"]
        return {e["topic_metadata"]["name"]: e["topic_metadata"]["type"] for e in entries}
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise damaged(bag, exc) from exc


def topic_types(reader: Any, bag: Path) -> dict[str, str]:  # noqa: ANN401
    """{topic: message type} with ROS 2 type names (rosbags normalises ROS 1 names); a topic recorded
    with two types is refused."""
    out: dict[str, str] = {}
    for conn in reader.connections:
        if out.setdefault(conn.topic, conn.msgtype) != conn.msgtype:
            raise UserError(f"{bag}: topic {conn.topic} carries two message types ({out[conn.topic]}, {conn.msgtype})",
                            hint="leave the topic out of the mapping, or split the bag by type first")
    return out


def first_message(reader: Any, topic: str, bag: Path) -> Any | None:  # noqa: ANN401
    """The topic's first message, deserialised (None when it has none)."""
    conns = [c for c in reader.connections if c.topic == topic]
    try:
        for conn, _, raw in reader.messages(conns):
            return reader.deserialize(raw, conn.msgtype)
    except Exception as exc:  # noqa: BLE001
        raise damaged(bag, exc, topic=topic) from exc
    return None


def receive_times(reader: Any, topics: Sequence[str], bag: Path) -> np.ndarray:  # noqa: ANN401
    """Receive times ([M] int64 ns) of every message on `topics`, in no particular order. A ROS 1 bag
    has them in its index (nothing decompressed); other bags are read without deserialising. `reader`:
    from `open_index` or `open_bag`."""
    conns = [c for c in reader.connections if c.topic in set(topics)]
    try:
        indexes = [getattr(c.owner, "indexes", None) for c in conns]
        if conns and all(ix is not None for ix in indexes):
            return np.array([e.time for c, ix in zip(conns, indexes) for e in ix[c.id]], np.int64)
        return np.array([ts for _, ts, _ in reader.messages(conns)], np.int64)
    except Exception as exc:  # noqa: BLE001
        raise damaged(bag, exc) from exc
