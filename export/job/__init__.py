"""The export job: config, per-episode build (map), executor backends, shard writing (reduce),
manifest and report assembly, and the journaled publish of a finished export."""
