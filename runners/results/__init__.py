"""Results: run records as tables and statistics, RESULTS.md (``document``) and the studies' own analyses."""
