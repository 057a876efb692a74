"""Pure core: resampling, window grids, extents, split/shard plans, statistics, plausibility checks.
Numbers in, numbers out: nothing here reads files, decodes media or knows about the job or the CLI."""
