"""The export job's pipeline: config, spec, per-episode build and staging (map), shard writing
(reduce), manifest and report assembly, and the run that drives them (locally or into object storage).
Where tasks run is export/executors/; writing OUT safely (publish, locks, fsync) is export/output/."""

from robowds.export.job.config import load_config
from robowds.export.job.run import Summary, run_export
from robowds.export.job.spec import JobSpec, resolve

__all__ = ["load_config", "JobSpec", "resolve", "Summary", "run_export"]
