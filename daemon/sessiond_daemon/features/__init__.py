"""The features: what each method does, over the core (to write) and the store
Protocols (to read)."""
