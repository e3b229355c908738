"""`quest train domain=<name> [preset=<p>] [attention=<variant>] [seed=<n>] [key.sub=value ...]`: one run."""
from __future__ import annotations

from pathlib import Path

from common.arguments import CommandParser
from common.records import RECORD_NAME, RunRecord
from runners.config import as_yaml, compose, run_directory


def main(argv: list[str]) -> int:
    parser = CommandParser("quest train", "One run: compose the config, train, test, write the record.")
    parser.add_argument("overrides", nargs="*", help="domain=<name> preset=<p> attention=<variant> seed=<n> key.sub=value ...")
    parser.add_argument("--print-config", action="store_true", help="show the composed config and exit")
    parser.add_argument("--wait", action="store_true", help="if another process is running this run, wait for it "
                        "to end and then run it (default: say so and exit 2)")
    args = parser.parse_intermixed_args(argv)
    cfg = compose(args.overrides)
    if args.print_config:
        print(as_yaml(cfg), end="")
        return 0
    from pytorch_lightning.utilities.rank_zero import rank_zero_only

    from runners.runs.training import run  # Lightning: only once the config is good

    record = run(cfg, wait=args.wait)
    if rank_zero_only.rank == 0:
        print(summary(record, run_directory(cfg)))
    return int(record.status == "failed")


def summary(record: RunRecord, run_dir: Path) -> str:
    """Two lines: the run's status and headline test metrics (``common.task.Task.summary_metrics``: the primary
    one, its baseline, the robustness summary), then where its record is."""
    metrics = record.metrics
    shown = [f"test {name} {metrics[f'test/{name}']:.4g}" for name in record.headline or [] if f"test/{name}" in metrics]
    outcome = [f"{record.status}: {record.domain}/{record.variant} seed {record.seed}", *shown]
    if record.divergence:
        outcome.append(f"diverged at step {record.divergence.step} ({record.divergence.reason})")
    if record.error:
        outcome.append(record.error)
    where = run_dir / ("error.log" if record.status == "failed" else RECORD_NAME)
    return " · ".join(outcome) + f"\n  {where}"
