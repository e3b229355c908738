"""Runs on disk: a run trained and tested (``training``), or many trained together (``ensemble``, with
``chunk``, ``stacked_data``, ``stacked_adamw`` and ``replayable``), its directory and lock (``rundir``), its record
(``record``), where it was made (``provenance``), the launch log of a folder of runs (``launches``), and the
robustness evaluation of a finished run (``robustness``)."""
