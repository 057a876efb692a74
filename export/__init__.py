"""robowds export: episode store -> resampled, padded windows in WebDataset shards + manifest."""

__version__ = "0.1.0"
