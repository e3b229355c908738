"""Results: run records as a table (``runs``), their statistics (``stats``), the tables and the document of
RESULTS.md (``tables``, ``document``), its plots (``plots``), and the learning-rate study (``stability``)."""
