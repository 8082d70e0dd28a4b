"""The stores: the registry that names them (registry.py); the interface and the stores
themselves move here from eventstore.py, sqlite/ and postgres/ (docs/architecture.md)."""
