"""Nothing moves: every run archived under RESULTS/records, composed again from its domain, preset, variant and
the keys where its config differs from those defaults, lands in its own directory (``seed<seed>-<hash>``). The
schema, the domains' typed sections and their presets keep every archived run's hash.

The graph runs recorded before ``model.ffn`` and ``model.global_residual`` existed lack those keys: no config
composed today can be theirs, and they are counted apart (``PREDATING``), so that none other drops out unseen. (Keys
added with a value that keeps older runs' hashes, ``UNHASHED_AT``, may be absent.)"""
import json
from pathlib import Path

from common.records import find_records
from runners.config import UNHASHED, UNHASHED_AT, as_dict, compose, config_hash

RECORDS = Path(__file__).parents[1] / "RESULTS" / "records"
PREDATING = 168  # runs of citation_select{,2,3} and fair/select/graph, before the graph model's ffn and global_residual


def leaves(tree: dict, prefix: str = ""):
    for name, value in tree.items():
        if isinstance(value, dict) and value:
            yield from leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def archived_configs() -> dict[str, list[str]]:
    """Each distinct archived config (as JSON) -> the run directories it was recorded in."""
    found: dict[str, list[str]] = {}
    for path in find_records(RECORDS):
        found.setdefault(json.dumps(json.loads(path.read_text())["config"]), []).append(path.parent.name)
    return found


def test_every_archived_run_composes_to_its_hash():
    defaults: dict[tuple, dict] = {}
    moved, predating = [], 0
    for text, folders in archived_configs().items():
        config = json.loads(text)
        groups = (f"domain={config['domain']}", f"preset={config['preset']}", f"attention={config['attention']['variant']}")
        if groups not in defaults:
            defaults[groups] = dict(leaves(as_dict(compose(list(groups)))))
        recorded = {key: value for key, value in leaves(config) if not key.startswith(UNHASHED)}
        expected = {key for key in defaults[groups] if not key.startswith(UNHASHED) and key not in UNHASHED_AT}
        if not expected <= set(recorded):
            predating += len(folders)
            continue
        overrides = [f"{key}={json.dumps(value) if not isinstance(value, str) else value}"
                     for key, value in recorded.items() if defaults[groups].get(key, ...) != value]
        composed = config_hash(compose([*groups, *overrides]))
        moved += [f"{' '.join(groups)}: {folder} composes to {composed}" for folder in folders
                  if not folder.endswith(composed)]
    assert not moved, f"{len(moved)} archived runs moved, e.g. {moved[:3]}"
    assert predating == PREDATING
