"""``tracealyze fleet``: every run under some roots analysed once, kept in an incremental
index, with the findings no single run shows (``suspect_host``).

One job per module: :mod:`.discover` finds runs and their fingerprints, :mod:`.analyse`
turns one run into its index rows (the summary's analysis), :mod:`.engines` runs those
analyses (local processes or Spark tasks), :mod:`.index` keeps the rows, :mod:`.hosts`
finds bad hosts across runs, :mod:`.fleet` ties them together, :mod:`.render` and
:mod:`.page` present the result, :mod:`.sql` serves ``query --fleet``.
"""
