"""The read models, each defined once for every store."""
