"""Media: probing videos, choosing the frame each window step gets, decoding, cropping, and the clip
and image encoders. Reads media files; knows nothing of stores, jobs or the CLI."""

from robowds.export.media.clips import encode_av1, encode_jpegs, encode_mp4
from robowds.export.media.frames import VideoError, probe_video, select_frames
from robowds.export.media.images import ImageOptions, encode_image
from robowds.export.media.video_windows import VideoOptions, VideoWindows

__all__ = ["VideoError", "probe_video", "select_frames", "VideoOptions", "VideoWindows", "ImageOptions", "encode_image", "encode_av1", "encode_jpegs", "encode_mp4"]
