"""Pure core: resampling, window grids, extents, split/shard plans, statistics, plausibility checks.
Numbers in, numbers out: nothing here reads files, decodes media or knows about the job or the CLI."""

from robowds.export.core.extent import episode_extent
from robowds.export.core.resample import Stream, StreamError, clean_stream, resample
from robowds.export.core.shard_plan import assign_splits, pack_shards, window_order
from robowds.export.core.stats import FieldStats, StatsAccumulator
from robowds.export.core.windows import StreamWindow, anchor_frames, query_times

__all__ = ["Stream", "StreamError", "clean_stream", "resample", "StreamWindow", "anchor_frames", "query_times", "episode_extent", "assign_splits", "pack_shards", "window_order", "FieldStats", "StatsAccumulator"]
