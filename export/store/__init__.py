"""The episode store: its schema and declarations (store.yaml), loading one episode, and validate.
Converters (export/convert/, to come) write stores that this package reads."""
