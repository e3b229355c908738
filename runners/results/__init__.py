"""Results: run records as a table (``frame``), their statistics (``stats``), the tables and the document of
RESULTS.md (``tables``, ``document``), its plots (``plots``), a pre-registered plan's tests (``confirmatory``) and
the seeds it needs (``sample_size``), the learning-rate study (``lr_sensitivity``) and the learning curves over
length and width (``learning_curves``)."""
