"""`quest train domain=<name> [preset=<p>] [attention=<variant>] [seed=<n>] [key.sub=value ...]`: one run.

Composes the config (``runners.config``), trains and tests the run (``runners.runs.training``), and prints
one line: its status and its test metrics, the primary one first.
"""
from __future__ import annotations

import argparse

from omegaconf import OmegaConf

from runners.config import compose


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="quest train", description="One run: compose the config, train, test, "
                                     "write the record.")
    parser.add_argument("overrides", nargs="*", help="domain=<name> preset=<p> attention=<variant> seed=<n> key.sub=value ...")
    parser.add_argument("--print-config", action="store_true", help="show the composed config and exit")
    parser.add_argument("--wait", action="store_true", help="if another process is running this run, wait for it "
                        "to end and then run it (default: say so and exit 2)")
    args = parser.parse_intermixed_args(argv)
    cfg = compose(args.overrides)
    if args.print_config:
        print(OmegaConf.to_yaml(cfg), end="")
        return 0
    from pytorch_lightning.utilities.rank_zero import rank_zero_only

    from runners.runs.training import run  # Lightning: only once the config is good

    record = run(cfg, wait=args.wait)
    failed = int(record["status"] == "failed")
    if rank_zero_only.rank != 0:
        return failed
    primary = f"test/{record['primary_metric']}"
    shown = sorted(record["metrics"], key=lambda k: (k != primary, k))[:8]  # per-class metrics can run to hundreds
    print(f"{record['status']}: {record['domain']}/{record['variant']} seed {record['seed']} "
          + " ".join(f"{k}={record['metrics'][k]:.4g}" for k in shown)
          + (f" ({record['error']})" if record["error"] else "")
          + (f" diverged at step {record['divergence']['step']}" if record["divergence"] else ""))
    return failed
