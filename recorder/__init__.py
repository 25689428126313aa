"""tracealyze.recorder: low-overhead training telemetry written to Parquet."""
