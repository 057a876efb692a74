"""Decoded camera frames -> stored RGB: crop in the decoded picture's own planes, scale there, convert last.

Why: the export used to convert the whole decoded frame to RGB, crop it in numpy and scale the RGB crop:
swscale's packed-RGB scaler is its slow path (2.6 ms per G1 frame, 640x480 AV1 -> 224x224, against
2.3 ms to decode it). Cropping the planes of a planar YUV frame costs nothing (FFmpeg's crop filter
only moves the plane pointers), scaling the planes of the crop is swscale's fast path, and the
unscaled YUV -> RGB conversion at the stored size is cheap: 0.4 ms per frame, the same picture to
43 dB PSNR (docs/video-and-images.md gives the rule and the figures).

The rule holds only where a plane crop is the same picture: 8-bit planar YUV (and grey) with crop
offsets on the chroma grid (`plane_boxes`). Everything else (packed RGB, NV12, 10-bit, a 4:2:0 crop at
an odd offset) goes the exact old way: the whole frame to RGB, the crop in numpy, the crop scaled.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from robowds.export.media.geometry import Box

# pixel formats whose planes crop independently: name -> (log2 chroma width, log2 chroma height)
# subsampling, None for a single plane; 8 bits per sample, one component per plane
PLANAR_FORMATS: dict[str, tuple[int, int] | None] = {
    "yuv420p": (1, 1), "yuvj420p": (1, 1), "yuv422p": (1, 0), "yuvj422p": (1, 0),
    "yuv444p": (0, 0), "yuvj444p": (0, 0), "gray": None,
}


def plane_boxes(box: Box, subsampling: tuple[int, int] | None) -> list[Box] | None:
    """The crop `box` (x, y, w, h in luma pixels) in each plane, or None when it cannot be cut there.

    Chroma sample c of a plane subsampled by 2**s covers luma samples [c * 2**s, (c + 1) * 2**s), so a
    crop whose offset is not a multiple of 2**s would need half of a chroma sample: None (the caller
    converts to RGB first). A cropped frame of w x h luma samples has ceil(w / 2**s) x ceil(h / 2**t)
    chroma samples, as FFmpeg sizes any frame (AV_CEIL_RSHIFT); they start at (x >> s, y >> t).
    """
    x, y, w, h = box
    if subsampling is None:
        return [box]
    sw, sh = subsampling
    if x % (1 << sw) or y % (1 << sh):
        return None
    chroma = (x >> sw, y >> sh, -(-w >> sw), -(-h >> sh))
    return [box, chroma, chroma]


RGBX_BLOCK = 16  # stored widths whose RGBX conversion matches rgb24's (see FrameConverter)


class FrameConverter:
    """Decoded frames of one video -> stored uint8 [H, W, 3], by the rule of this module.

    Holds one swscale context per step (building one per frame cost more than decoding a small frame)
    and, for a plane crop, one FFmpeg filter graph with a single `crop` filter. Every FFmpeg step runs
    with one thread: the export runs one process per core, and forked DataLoader workers must not
    inherit FFmpeg threads (tests/test_fork_safety.py)."""

    def __init__(self, width: int, height: int, pix_fmt: str, box: Box | None,
                 resize: tuple[int, int] | None, exact: bool = False, rgbx: bool = False) -> None:
        """`exact`: always the RGB-first path (what the export did before; for comparisons). `rgbx`: the
        plane path returns swscale's RGBX output as it is, [H, W, 4] (the same RGB values, the 4th byte
        unused): no copy, and Pillow encodes it without one either (images.jpeg_bytes). Only for stored
        widths that are a multiple of `RGBX_BLOCK`: this FFmpeg's unscaled yuv420p -> rgb0 converter
        writes wrong colours in the last columns of widths 16k + 2 and 16k + 4 (up to 254 levels off;
        rgb24 is right; tests/test_video_planes.py), so other widths take rgb24."""
        from av.video.reformatter import VideoReformatter

        self.source = (width, height, pix_fmt)  # what the plane path was set up for
        self.box, self.resize = box, resize
        self.rgbx = rgbx and resize is not None and resize[0] % RGBX_BLOCK == 0
        self._scaler, self._to_rgb, self._rgb_scaler = VideoReformatter(), VideoReformatter(), VideoReformatter()
        subsampling = PLANAR_FORMATS.get(pix_fmt, (-1, -1))
        crop_size = (box[2], box[3]) if box else (width, height)
        # without scaling the whole-frame conversion is cheap (swscale's unscaled converter) and keeps
        # the pixels every export before this rule gave; the plane path pays off where it scales
        self.planar = (not exact and resize is not None and resize != crop_size and subsampling != (-1, -1)
                       and (box is None or plane_boxes(box, subsampling) is not None))
        self._graph: Any = None

    def _crop_graph(self, frame: Any) -> Any:
        """buffer -> crop (exact: offsets are on the chroma grid, checked by `plane_boxes`) -> sink."""
        import av.filter

        x, y, w, h = self.box  # type: ignore[misc]
        graph = av.filter.Graph()
        graph.threads = 1
        # the frame's own colour tags, so the buffer does not take them for a change of properties
        source = graph.add("buffer", video_size=f"{frame.width}x{frame.height}", pix_fmt=str(int(frame.format)),
                           time_base=str(frame.time_base or 1), pixel_aspect="1/1",
                           colorspace=str(int(frame.colorspace)), range=str(int(frame.color_range)))
        crop = graph.add("crop", f"w={w}:h={h}:x={x}:y={y}:exact=1")
        sink = graph.add("buffersink")
        source.link_to(crop)
        crop.link_to(sink)
        graph.configure()
        return graph

    def __call__(self, frame: Any) -> np.ndarray:
        """One decoded frame -> [H, W, 3] uint8 (H, W: the resize, else the crop, else the source); [H, W, 4]
        RGBX on the plane path when asked for (`rgbx`)."""
        scaled = self.scaled(frame)
        return self._exact(frame) if scaled is None else self.to_rgb(scaled)

    def scaled(self, frame: Any) -> Any:
        """The plane path's picture before the RGB conversion: the frame cropped (no copy) and scaled
        (bilinear) in its own planes, a VideoFrame of the stored size in the source's pixel format; None
        where the plane path does not apply (the frame goes the exact way)."""
        if not (self.planar and (frame.width, frame.height, frame.format.name) == self.source):
            return None
        width, height = self.resize  # type: ignore[misc]
        return self._scaler.reformat(self.crop(frame), width=width, height=height, threads=1)

    def crop(self, frame: Any) -> Any:
        """The decoded frame cut to the crop box in its own planes (the plane path only): no copy, the
        planes point into the decoded frame, and every property of the frame is kept (colour tags, and
        the chroma siting that swscale's scaler honours and PyAV cannot set on a frame of its own)."""
        if self.box is None:
            return frame
        if self._graph is None:
            self._graph = self._crop_graph(frame)
        self._graph.push(frame)
        return self._graph.pull()  # [h, w] luma, chroma per `plane_boxes`

    def to_rgb(self, scaled: Any) -> np.ndarray:
        """A `scaled` picture converted to RGB at its size (unscaled): [H, W, 3], or [H, W, 4] RGBX (`rgbx`)."""
        if not self.rgbx:
            return self._to_rgb.reformat(scaled, format="rgb24", threads=1).to_ndarray()  # [H, W, 3]
        plane = self._to_rgb.reformat(scaled, format="rgb0", threads=1).planes[0]  # same RGB as rgb24 (tested)
        rows = np.frombuffer(plane, np.uint8).reshape(scaled.height, plane.line_size // 4, 4)  # [H, line, 4] view
        return rows[:, :scaled.width]  # [H, W, 4]: keeps the frame's buffer alive, no copy

    def _exact(self, frame: Any) -> np.ndarray:
        """The whole frame to RGB (scaled in the same pass when there is no crop), then crop, then scale."""
        from av import VideoFrame

        resize = self.resize
        if self.box is None:
            width, height = resize or (None, None)
            return self._to_rgb.reformat(frame, format="rgb24", width=width, height=height,
                                         threads=1).to_ndarray()  # [H, W, 3]
        x, y, w, h = self.box
        rgb = self._to_rgb.reformat(frame, format="rgb24", threads=1).to_ndarray()  # [H0, W0, 3]
        cropped = np.ascontiguousarray(rgb[y:y + h, x:x + w])  # [h, w, 3], a copy: the full frame is freed
        if resize is None or resize == (w, h):
            return cropped
        small = VideoFrame.from_ndarray(cropped, format="rgb24")
        return self._rgb_scaler.reformat(small, width=resize[0], height=resize[1], threads=1).to_ndarray()
