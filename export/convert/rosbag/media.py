"""Image topics -> one video file per episode: `sensor_msgs/CompressedImage` JPEG frames muxed as MJPEG
byte for byte (`mux_jpegs`: the decoded frames are the source's own JPEG decodes), raw
`sensor_msgs/Image` (rgb8, bgr8, mono8, rgba8, bgra8) and PNG CompressedImage frames encoded
losslessly with FFV1 (`encode_frames`).

Frames are spooled to a file in the episode's work folder while the bag is read (a camera topic is
interleaved with the other topics, and an hour of 640x480 frames does not fit in memory), then written
in time order: raw frames through a memory map, JPEG bytes read back one at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from robowds.export.convert.rosbag.mapping import seconds
from robowds.export.media.encode import encode_frames, mux_jpegs

SOF_MARKERS = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # JPEG start-of-frame markers (not DHT, JPG, DAC)
CHANNELS = {"rgb8": 3, "bgr8": 3, "mono8": 1, "rgba8": 4, "bgra8": 4}


def jpeg_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a JPEG's start-of-frame header, without decoding; ValueError if `data` is
    not a JPEG."""
    if data[:2] != b"\xff\xd8":
        raise ValueError("not a JPEG (no SOI marker)")
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            raise ValueError(f"not a JPEG marker at byte {i}")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            i += 2
            continue
        if marker in SOF_MARKERS and i + 9 <= len(data):
            return int.from_bytes(data[i + 7:i + 9], "big"), int.from_bytes(data[i + 5:i + 7], "big")
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    raise ValueError("no JPEG frame header")


def raw_rgb(encoding: str, height: int, width: int, step: int, data: np.ndarray) -> np.ndarray:
    """A `sensor_msgs/Image` as RGB ([H, W, 3] uint8); ValueError for an encoding it does not take."""
    channels = CHANNELS.get(encoding.lower())
    if channels is None:
        raise ValueError(f"image encoding {encoding!r} is not one of {', '.join(CHANNELS)}")
    data = np.asarray(data, np.uint8).reshape(-1)
    if step < width * channels or len(data) < height * step:
        raise ValueError(f"{encoding} image of {width}x{height} with step {step} needs {height * step} bytes, "
                         f"has {len(data)}")
    pixels = data[: height * step].reshape(height, step)[:, : width * channels].reshape(height, width, channels)
    enc = encoding.lower()
    if enc == "mono8":
        return np.repeat(pixels, 3, axis=2)
    if enc.startswith("bgr"):
        return pixels[..., 2::-1]
    return pixels[..., :3]


def _png_rgb(data: bytes) -> np.ndarray:
    import av

    context = av.CodecContext.create("png", "r")
    frames = list(context.decode(av.Packet(data)))
    if not frames:
        raise ValueError("PNG data that decodes to no frame")
    return frames[0].to_ndarray(format="rgb24")


class FrameSpool:
    """The frames of one image topic in one episode, on disk in message order."""

    def __init__(self, path: Path, topic: str) -> None:
        self.path, self.topic = path, topic
        self.file = path.open("wb")
        self.jpeg: bool | None = None  # decided by the first frame
        self.size: tuple[int, int] | None = None  # (width, height)
        self.offsets: list[int] = [0]  # JPEG byte offsets, [F + 1]

    def add(self, msg: Any) -> None:  # noqa: ANN401 (a rosbags message)
        """Append one Image or CompressedImage message's frame; ValueError names what is wrong."""
        if hasattr(msg, "encoding"):  # sensor_msgs/Image
            jpeg, rgb = False, raw_rgb(msg.encoding, msg.height, msg.width, msg.step, msg.data)
        else:
            data = np.asarray(msg.data, np.uint8).tobytes()
            jpeg = data[:2] == b"\xff\xd8"
            if jpeg:
                size = jpeg_size(data)
            elif data[:8] == b"\x89PNG\r\n\x1a\n":
                rgb = _png_rgb(data)
            else:
                raise ValueError(f"compressed image format {msg.format!r} is neither JPEG nor PNG")
        if not jpeg:
            size = (rgb.shape[1], rgb.shape[0])
        if self.jpeg is None:
            self.jpeg, self.size = jpeg, size
        if jpeg != self.jpeg:
            raise ValueError("the topic mixes JPEG frames with other frames")
        if size != self.size:
            raise ValueError(f"frame size changes from {self.size[0]}x{self.size[1]} to {size[0]}x{size[1]}")
        if jpeg:
            self.file.write(data)
            self.offsets.append(self.offsets[-1] + len(data))
        else:
            self.file.write(np.ascontiguousarray(rgb).tobytes())

    def write_video(self, times_ns: np.ndarray, out: Path) -> tuple[float, float, list[str]]:
        """Encode the spooled frames at `times_ns` ([F] int64 ns, one per frame in message order) into
        `out`: (clock_offset_s, fps, notes). Frames are put in time order; frames within one
        millisecond of the previous one (Matroska's time base) are dropped and noted."""
        self.file.close()
        times = np.asarray(times_ns, np.int64)
        order = np.argsort(times, kind="stable")  # [F]
        ms = np.rint((times[order] - times[order[0]]) / 1e6)
        keep = np.concatenate([[True], np.diff(ms) > 0])
        frames = order[keep]  # [F'] message indices in time order
        t = seconds(times[frames])  # [F'] float64 s
        notes = []
        if not np.array_equal(order, np.arange(len(order))):
            notes.append(f"{self.topic}: frames put in time order")
        if not keep.all():
            notes.append(f"{self.topic}: {int((~keep).sum())} frames within 1 ms of the previous one dropped")
        fps = 1e9 / float(np.median(np.diff(times[frames]))) if len(frames) > 1 else 1.0
        out.parent.mkdir(parents=True, exist_ok=True)
        width, height = self.size or (0, 0)
        if self.jpeg:
            offset = mux_jpegs(_JpegReader(self.path, self.offsets, frames), t, out, width, height)
        else:
            spooled = np.memmap(self.path, np.uint8, "r", shape=(len(times), height, width, 3))  # [F, H, W, 3]
            chosen = spooled if len(frames) == len(times) and np.all(np.diff(frames) > 0) else spooled[frames]
            offset = encode_frames(chosen, t, out, codec="ffv1")
            del spooled, chosen
        self.path.unlink()
        return offset, fps, notes

    def discard(self) -> None:
        self.file.close()
        self.path.unlink(missing_ok=True)


class _JpegReader(Sequence[bytes]):
    """The spooled JPEGs `frames` (message indices) as a sequence of bytes, read on demand."""

    def __init__(self, path: Path, offsets: list[int], frames: np.ndarray) -> None:
        self.path, self.offsets, self.frames = path, offsets, frames

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, k: int) -> bytes:  # type: ignore[override]
        i = int(self.frames[k])
        with self.path.open("rb") as f:
            f.seek(self.offsets[i])
            return f.read(self.offsets[i + 1] - self.offsets[i])

    def __iter__(self) -> Iterator[bytes]:
        with self.path.open("rb") as f:
            for i in self.frames:
                f.seek(self.offsets[int(i)])
                yield f.read(self.offsets[int(i) + 1] - self.offsets[int(i)])

