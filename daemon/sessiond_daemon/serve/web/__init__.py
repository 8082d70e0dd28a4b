"""The daemon's HTTP face: the Durable Streams protocol over sessions, and /metrics."""
