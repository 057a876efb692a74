"""The export job: config, per-episode build (map), executor backends, shard writing (reduce),
manifest and report assembly, and the journaled publish of a finished export."""

from robowds.export.job.config import load_config
from robowds.export.job.run import Summary, run_export
from robowds.export.job.spec import JobSpec, resolve

__all__ = ["load_config", "JobSpec", "resolve", "Summary", "run_export"]
