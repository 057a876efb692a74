"""The episode store: its schema, declarations (store.yaml), kind inference, media paths and fingerprint,
loading one episode, and validate.
Converters (export/convert/) write stores that this package reads."""

from robowds.export.store.declarations import FieldSpec
from robowds.export.store.episodes import EpisodeData, EpisodeLoader
from robowds.export.store.schema import StoreSchema, open_store
from robowds.export.store.validate import StoreReport, validate_store

__all__ = ["FieldSpec", "StoreSchema", "open_store", "EpisodeData", "EpisodeLoader", "StoreReport", "validate_store"]
