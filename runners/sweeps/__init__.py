"""Sweeps: a sweep file and its runs (``spec``), what each run came to (``bookkeeping``, ``progress``), the
worker processes that make them (``workers``), SLURM job arrays (``slurm``) and the chunks of runs that the
ensemble trainer (``runners.runs.ensemble``) makes many at once (``ensemble``)."""
