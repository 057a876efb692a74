"""Checks of a finished export: verify (shard integrity, manifest, member schema) and recompute
(windows rebuilt from the store and compared byte for byte).

The names below are imported on first use (`robowds.export.lazy_exports` says why): a `verify
--workers` pool worker imports `check.shard_check` and `check.shared_map` without `verify` and all it
needs."""

from typing import TYPE_CHECKING

from robowds.export.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from robowds.export.check.result import VerifyResult
    from robowds.export.check.verify import verify_export

__all__ = ["VerifyResult", "verify_export"]
__getattr__ = lazy_exports(__name__, {"VerifyResult": "result", "verify_export": "verify"})
