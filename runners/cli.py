"""`quest` command: train | sweep | ensemble | aggregate | stability | bench | feed | generate | list | robustness
| imagenet.

Exit status: 0 ok (a diverged run is a result), 1 a run failed, 2 the input is wrong (config, data, paths),
128 + N stopped by signal N (130: SIGINT, Ctrl-C; 143: SIGTERM, a scheduler's preemption).
Heavy packages (torch, Lightning, the domains) load only once the config's keys are known to be good, so a
mistyped key is answered in about a second.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from omegaconf import OmegaConf

from common.errors import ConfigError, DataError, Stopped

SUBCOMMANDS = {"train": "runners.cli", "list": "runners.cli", "sweep": "runners.sweep",
               "aggregate": "runners.aggregate", "bench": "runners.bench", "robustness": "runners.robustness",
               "stability": "runners.stability", "feed": "runners.feed", "generate": "runners.generate",
               "ensemble": "runners.ensemble", "imagenet": "runners.imagenet"}


def train_main(argv: list[str]) -> int:
    from runners.config import compose

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

    from runners.train import run

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


def list_main(argv: list[str]) -> int:
    import runners.config  # noqa: F401  (makes the project's domains package known)
    from common.attention import ABLATIONS, VARIANTS
    from common.registry import domain_names, get_domain

    argparse.ArgumentParser(prog="quest list", description="Domains, datasets and attention variants.").parse_args(argv)
    print("domains:")
    for name in domain_names():
        try:
            d = get_domain(name)
        except Exception as err:  # one broken plugin must not hide the others
            print(f"  {name:14s} (cannot load: {type(err).__name__}: {err})")
            continue
        print(f"  {name:14s} metric {d.metric} ({d.mode})  datasets: {', '.join(d.datasets)}")
    print("variants:", ", ".join(VARIANTS))
    print("ablations:", ", ".join(ABLATIONS))
    return 0


def main(argv: list[str] | None = None) -> int:
    from common.records import RecordError
    from runners import console

    console.show_project_warnings()
    console.quiet()
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in SUBCOMMANDS:
        print(__doc__.strip() + "\nusage: quest {" + ",".join(SUBCOMMANDS) + "} ... (each takes --help)", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    command = argv[0]
    try:
        module = importlib.import_module(SUBCOMMANDS[command])
        entry = getattr(module, f"{command}_main", None) or module.main
        return entry(argv[1:])
    except (ConfigError, DataError, RecordError, FileNotFoundError) as err:
        print(f"quest: error: {err}", file=sys.stderr)
        return 2
    except Stopped as stop:  # SIGINT or SIGTERM: stopped on purpose, not a crash
        print(f"quest: {stop}", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:  # Ctrl-C outside a run (composing, importing)
        print("quest: stopped by SIGINT", file=sys.stderr)
        return 130
    except Exception as err:  # not the user's input: keep the traceback for whoever debugs it
        traceback.print_exc()
        print(f"quest: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
