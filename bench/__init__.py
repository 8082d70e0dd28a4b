"""sessiond's benchmarks: figures beside raw-SQLite baselines measured in the same run."""
