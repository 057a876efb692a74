"""The episode store: its schema and declarations (store.yaml), loading one episode, and validate.
Converters (export/convert/, to come) write stores that this package reads."""

from robowds.export.store.episodes import EpisodeData, EpisodeLoader
from robowds.export.store.schema import FieldSpec, StoreSchema, open_store
from robowds.export.store.validate import StoreReport, validate_store

__all__ = ["FieldSpec", "StoreSchema", "open_store", "EpisodeData", "EpisodeLoader", "StoreReport", "validate_store"]
