"""The episode store: its schema, declarations (store.yaml), kind inference, media paths and fingerprint,
loading one episode, and validate.
Converters (export/convert/) write stores that this package reads.

The names below are imported on first use (`robowds.export.lazy_exports` says why): a process that
needs only `robowds.export.store.location` does not import pyarrow and yaml with it."""

from typing import TYPE_CHECKING

from robowds.export.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from robowds.export.store.declarations import FieldSpec
    from robowds.export.store.episodes import EpisodeData, EpisodeLoader
    from robowds.export.store.schema import StoreSchema, open_store
    from robowds.export.store.validate import StoreReport, validate_store

__all__ = ["FieldSpec", "StoreSchema", "open_store", "EpisodeData", "EpisodeLoader", "StoreReport", "validate_store"]
__getattr__ = lazy_exports(__name__, {
    "FieldSpec": "declarations", "EpisodeData": "episodes", "EpisodeLoader": "episodes", "StoreSchema": "schema",
    "open_store": "schema", "StoreReport": "validate", "validate_store": "validate"})
