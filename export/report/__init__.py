"""`robowds report`: one self-contained HTML page describing an export (summary, fields, episodes,
sampled windows, source overlays, cameras), built from the manifest and the export's side files
without re-reading every shard."""
