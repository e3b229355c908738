"""Runs on disk: a run trained and tested (``training``), or many trained together (``ensemble``, with
``chunk``, ``stacked_data``, ``stacked_adamw`` and ``replayable``), its directory and lock (``rundir``), its record
filled in (``recording``), where it was made (``provenance``), the launch log of a folder of runs (``launches``),
the robust accuracy of a finished run (``robust_accuracy``), its snapshots tested (``snapshot_tests``) and a folder
of runs made small enough to commit (``export``)."""
