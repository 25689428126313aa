"""The report's charts by subject: training curves, tensors, performance, ranks, profiler
traces. Each module returns plotly specs built from DuckDB-downsampled series."""
