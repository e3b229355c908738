"""`quest aggregate <runs dir> ... [--report REPORT.md ...] [--notes NOTES.md] [-o RESULTS.md]`: run records ->
markdown tables, CSV and plots, with the reports of studies that have their own analysis.

Per domain, dataset and preset: rows = variants, columns = test metrics as mean ± the half-width of its 95%
t-interval over runs, the number of finished runs, diverged and failed counts, best value per column in bold
(none where all variants tie); then the difference of the primary metric to `standard`, paired by seed, with
its 95% interval and a paired t-test whose p-values are Holm-corrected over the variants of the table, a
one-line verdict, and that group's plots. A variant whose metrics equal an earlier variant's on every seed
computed the same function in that setting (elliptical in one layer, a per-head gain with one head): it is
marked ``≡ <variant>``, neither tested nor ranked. Across domains: each variant's primary metric per
domain, its rank there (1 = best) and its mean rank, and how many domains find it significantly better,
not different or worse than `standard`.
A record that cannot be read or breaks the schema is skipped with a warning and listed at the end.

``--report`` adds a study's own report (``quest stability``, ``quest retrieval-report``) as a
section: its headings one level down, its figures copied beside the CSV. ``--notes`` adds the hand-written
reading of the numbers: each ``## <heading>`` section of the notes file goes under the generated heading of
the same text, marked as written by hand, so RESULTS.md is regenerated, never edited, and the prose stays
beside the numbers it reads. A note whose heading matches nothing is an error (exit 2): it would be lost.
``--confirm`` adds the confirmatory tests of a pre-registered plan (``runners.results.confirmatory``; repeated, several
plans side by side, each on its own runs, with a summary of what each found at the top), and a sweep
with a tuned protocol (``select:``) adds the table of its choices; runs of a sweep with a ``label:`` (another init)
beside those without add whether each verdict holds under that setting.
"""
from __future__ import annotations

from pathlib import Path

from common.arguments import CommandParser
from common.errors import Stopped
from runners.results.document import write_results


def main(argv: list[str]) -> int:
    parser = CommandParser("quest aggregate", __doc__)
    parser.add_argument("runs", nargs="*", help="directories of runs (searched recursively for record.json)")
    parser.add_argument("-o", "--output", default="RESULTS.md", help="markdown file to write")
    parser.add_argument("--report", action="append", default=[], type=Path, metavar="REPORT_MD",
                        help="a study's own markdown report, added as a section (repeatable)")
    parser.add_argument("--notes", type=Path, metavar="NOTES_MD", help="hand-written reading, by section heading")
    parser.add_argument("--anchors", type=Path, metavar="ANCHORS_YAML",
                        help="the paper's numbers and the settings here nearest to them (a Paper anchors section)")
    parser.add_argument("--confirm", action="append", default=[], type=Path, metavar="PREREGISTRATION_MD",
                        help="a committed analysis plan: its hypotheses tested on its runs only (Confirmatory tests); "
                             "repeatable, the plans side by side")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    if not args.runs and not args.report:
        parser.error("give run directories, --report files, or both")
    with Stopped.on_signals():  # a signal stops it in one line, every output it had not yet replaced left whole
        runs, skipped, reports = write_results(args.runs, Path(args.output), args.report, args.notes, args.anchors,
                                               plots=not args.no_plots, confirm=args.confirm)
    print(f"aggregate: {runs} runs, {skipped} skipped, {reports} reports -> {args.output}")
    return 0
