"""Checks of a finished export: verify (shard integrity, manifest, member schema) and recompute
(windows rebuilt from the store and compared byte for byte)."""
