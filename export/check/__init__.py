"""Checks of a finished export: verify (shard integrity, manifest, member schema) and recompute
(windows rebuilt from the store and compared byte for byte)."""

from robowds.export.check.result import VerifyResult
from robowds.export.check.verify import verify_export

__all__ = ["VerifyResult", "verify_export"]
