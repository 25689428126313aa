"""tracealyze.analyzer: reads run directories with DuckDB and says what went wrong.

Never imports torch (start-up must stay fast and the analyzer runs where torch is absent).
"""
