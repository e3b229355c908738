"""What a run's record notes of its test metrics beside their values: which way each is better
(``directions``), what each trivial baseline predicts (``baselines``), and which a summary shows
(``headline``). A task declares its notes as ``Task.notes``, a ``MetricNotes`` class; a domain whose task
logs metrics of its own (per-class scores, a baseline) subclasses it. Kept apart from ``Task``, which is about
training: the notes only read what the task's metrics say of themselves."""
from __future__ import annotations


class MetricNotes:
    """The notes of ``task``'s test metrics (``task``: a ``common.task.Task`` after testing)."""

    def __init__(self, task):
        self.task = task

    def directions(self) -> dict[str, str]:
        """Which way each test metric is better, ``"min"`` or ``"max"``, by its logged name less ``test/``: the
        loss, and what each torchmetrics metric says of itself (``higher_is_better``; a metric that says
        nothing is left out), a perturbed score going the way of the headline metric. A task that logs
        other test metrics adds theirs."""
        found = {"loss": "min"}
        for name, metric in self.task.test_metrics.items(keep_base=True):
            if metric.higher_is_better is not None:
                found[name] = "max" if metric.higher_is_better else "min"
        if self.task.headline in found:
            found.update(dict.fromkeys(self.task.perturbed_names, found[self.task.headline]))
        return found

    def baselines(self) -> dict[str, str]:
        """What each trivial baseline among the metrics predicts (its ``description``), by metric name."""
        return {name: metric.description for name, metric in self.task.test_metrics.items(keep_base=True)
                if hasattr(metric, "description")}

    def headline(self, primary: str) -> list[str]:
        """The test metrics a run's summary line shows: the primary one, its trivial baseline where the task
        has one, and the robustness summary; per-class and per-condition scores stay in the record."""
        baseline = f"{primary}_baseline"
        return [primary, *([baseline] if baseline in self.baselines() else []), *self.robustness_summary()]

    def robustness_summary(self) -> list[str]:
        """The perturbed scores that summarise robustness: by default each one logged (a condition each)."""
        return sorted(self.task.perturbed_names)
