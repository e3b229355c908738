import math
import os

import pandas as pd
import pytest
import torch
from conftest import make_record, record_json
from pydantic import ValidationError

from common.records import RecordError, RunRecord, read_record, write_record
from common.registry import get_domain
from common.schema import Optim
from common.task import lr_schedule
from runners.cli import main as cli
from runners.config import KEY_ORDER, ConfigError, as_dict, compose, run_directory
from runners.runs.training import check_settings, device_batch, train
from runners.sweeps import slurm
from runners.sweeps.spec import Sweep, expand, load_sweep


def test_plugin_domain_runs_through_quest_train(toy_domain, run_args, capsys):
    assert cli(["train", "domain=toy", "preset=smoke", "attention=qknorm", *run_args]) == 0
    cfg = compose(["domain=toy", "preset=smoke", "attention=qknorm", *run_args])
    record = read_record(run_directory(cfg))
    # the summary: status and headline metrics, then where the record is
    assert capsys.readouterr().out.splitlines()[-2:] == [
        f"ok: toy/qknorm seed 0 · test mse {record.metrics['test/mse']:.4g}", f"  {run_directory(cfg) / 'record.json'}"]
    assert record.status == "ok" and record.variant == "qknorm" and record.params > 0
    assert math.isfinite(record.metrics["test/mse"]) and record.best_val.epoch in (0, 1)
    assert set(record.probes) >= {"max_logit", "k_norm_max", "q_norm_mean", "entropy"}
    assert (run_directory(cfg) / "checkpoints" / "best.ckpt").exists()
    assert (run_directory(cfg) / "metrics.csv").exists()
    timing = record.timing  # where the wall time went
    assert timing.steps == 8 and 0 < timing.checkpoint_s < timing.fit_s and timing.test_s > 0
    assert timing.build_s + timing.fit_s + timing.test_s <= record.wall_time_s


def test_a_log_file_or_pipe_gets_progress_lines_at_the_interval_and_no_bar(toy_domain, run_args, capsys):
    """capsys is no terminal: ``progress.style=auto`` prints lines, one per 3 steps and one at the end."""
    assert cli(["train", "domain=toy", "preset=smoke", "progress.every_n_steps=3", *run_args[:2]]) == 0  # 2 x 4 steps
    out, err = capsys.readouterr()
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert [line.split(" · ")[0] for line in lines] == ["step 3/8", "step 6/8", "step 8/8"]
    assert all(" · loss " in line and " it/s" in line for line in lines) and "val mse" in lines[-1]
    assert "eta " in lines[0] and "eta " not in lines[-1]
    assert "Epoch 0" not in out + err  # no bar
    assert cli(["train", "domain=toy", "preset=smoke", "progress.style=bar", "seed=1", *run_args[:2]]) == 0
    out, err = capsys.readouterr()
    assert "Epoch 1" in out + err and not any(line.startswith("step ") for line in out.splitlines())
    assert cli(["train", "domain=toy", "progress.style=fancy", *run_args]) == 2
    assert "unknown progress.style='fancy'; choose from auto, bar, lines, none" in capsys.readouterr().err


def test_the_training_loss_reaches_the_log_at_lightnings_steps(toy_domain, run_args):
    """Every log_every_n_steps-th optimiser step's loss, logged at that step as a per-step self.log would be
    (steps n-1, 2n-1, ...); with accumulation, optimiser steps count, not batches."""
    def logged(*args):
        cfg = compose(["domain=toy", "preset=smoke", "trainer.log_every_n_steps=3", *args, *run_args])
        train(["domain=toy", "preset=smoke", "trainer.log_every_n_steps=3", *args, *run_args])
        rows = pd.read_csv(run_directory(cfg) / "metrics.csv").dropna(subset=["train/loss"])
        assert rows["train/loss"].gt(0).all() and set(rows["epoch"]) <= {0, 1}
        return rows["step"].tolist()

    assert logged() == [2, 5]  # 2 epochs x 4 batches
    assert logged("trainer.accumulate_grad_batches=2", "seed=1") == [2]  # 4 optimiser steps


def test_summary_headline_is_primary_baseline_and_robustness_summary(tmp_path):
    """Segmentation's line shows mIoU, its baseline and the corruption mean, not per-class or per-corruption
    scores, which stay in the record; a diverged run says where and why."""
    from runners.commands.train import summary

    metrics = {"miou": 0.41, "miou_baseline": 0.05, "miou_corrupt": 0.3, "iou_0": 0.9, "miou_brightness": 0.35}
    record = make_record("quest", 2, metrics, domain="segmentation", headline=["miou", "miou_baseline", "miou_corrupt"])
    assert summary(record, tmp_path) == (f"ok: segmentation/quest seed 2 · test miou 0.41 · test miou_baseline 0.05 · "
                                         f"test miou_corrupt 0.3\n  {tmp_path / 'record.json'}")
    record.status, record.metrics = "diverged", {}
    record.divergence = {"step": 7, "reason": "non-finite training loss"}
    assert summary(record, tmp_path).startswith("diverged: segmentation/quest seed 2 · diverged at step 7 "
                                                "(non-finite training loss)\n")


def test_config_errors_are_one_line_and_exit_2(toy_domain, run_args, capsys):
    cases = {
        "optim.lrr=1": "unknown config key 'optim.lrr' (command line); valid keys at optim: betas, cooldown_steps, "
                       "independent_weight_decay, lr",
        "optim.lr=fast": "config key 'optim.lr' (command line) expects float",
        'optim.lr="0.001"': "expects float like 0.001, got '0.001' (a string: drop its quotes)",
        "attention=questt": "unknown attention.variant='questt'; choose from standard, quest",
        "attention=QUEST": "elliptical_quest, uniform (did you mean quest?)",
        "data.dataset=randm": "unknown data.dataset='randm'; choose from random",
        "preset=huge": "unknown preset 'huge' for domain 'toy'; choose from smoke, demo",
        "trainer=3": "config key 'trainer' (command line) is a section",
        "novalue": "override 'novalue' is not of the form key=value",
        "attention.l2norm_kernel=fast": "unknown attention.l2norm_kernel='fast'; choose from fused, formula",
    }
    for arg, message in cases.items():
        assert cli(["train", "domain=toy", arg, *run_args]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert cli(["train", "domain=nope"]) == 2
    assert "unknown domain 'nope'; choose from" in capsys.readouterr().err


def test_an_unknown_key_names_the_closest_one():
    with pytest.raises(ConfigError, match=r"did you mean task\.perturbations\.severities\?$"):
        compose(["domain=segmentation", "data.robustness.severities=[1]"])
    with pytest.raises(ConfigError, match=r"did you mean optim\.lr\?$"):
        compose(["domain=segmentation", "optim.lrr=0.1"])


def test_a_shared_sections_key_is_its_domains():
    """A key of a shared section (common.sections) takes its domain's default, says it in an error, and keeps the
    config's text in the order the domain's archived runs were hashed in (configs/key_order.yaml)."""
    defaults = get_domain("timeseries").config.model_fields
    data, model = defaults["data"].default, defaults["model"].default
    assert (data.batch_size, model.dim, model.depth, model.mlp_ratio, model.heads) == (64, 64, 2, 2.0, 4)
    assert list(as_dict(compose(["domain=timeseries"]))["model"]) == KEY_ORDER["timeseries"]["model"]
    with pytest.raises(ConfigError, match=r"^config key 'data.batch_size' \(command line\) expects int like 64, got 'x'$"):
        compose(["domain=timeseries", "data.batch_size=x"])


def test_the_schema_types_defaults_and_ranges_every_run(toy_domain):
    """The schema's models are the defaults and the checks: a composed config starts from them, ``Optim``
    checks itself as the config does, and the optimisers the schema names are the ones the task builds."""
    from common.schema import OPTIMIZER_NAMES, Optim, RunConfig, section
    from common.task import OPTIMIZERS

    cfg = compose(["domain=toy"])
    assert cfg.optim.betas == Optim().betas and cfg.probes.max_logit_bound == RunConfig(domain="toy").probes.max_logit_bound
    assert tuple(OPTIMIZERS) == OPTIMIZER_NAMES
    with pytest.raises(ConfigError, match=r"^config key 'optim.lr' must be > 0, got 0$"):
        section(Optim, {"lr": 0}, "optim")
    with pytest.raises(ConfigError, match=r"^unknown optim.schedule='step'; choose from cosine, poly"):
        section(Optim, {"schedule": "step"}, "optim")
    with pytest.raises(ConfigError, match=r"expects int or null like 1, got 'often'$"):
        compose(["domain=toy", "trainer.check_val_every_n_epoch=often"])
    # a Lightning argument a domain's file adds to ``trainer`` is typed by its default there
    with pytest.raises(ConfigError, match=r"'trainer.val_check_interval' \(command line\) expects int or null like 250"):
        compose(["domain=language", "trainer.val_check_interval=often"])


ARCHIVED = ["budget/language/language/standard/seed100-496ae07452", "budget/vision/vision/standard/seed100-6a253106d7",
            "citation/graph/elliptical/seed0-71bc6ededc", "fair/pointcloud/qknorm/seed10-6b263c12ff",
            "fair/segmentation/qknorm/seed10-80f01b7935", "fair/select/speech/qknorm/seed100-2b93b8e9ff",
            "fair/timeseries/qknorm/seed5-ddd3239fde", "mechanism-aniso/retrieval/qknorm/seed0-15cde6cd2a"]


@pytest.mark.parametrize("folder", ARCHIVED)
def test_an_archived_run_composes_to_its_hash(folder):
    """A run archived in RESULTS/records, composed again from its domain, preset, variant and the keys where its
    config differs from those defaults, lands in its own directory: the schema keeps every run's hash."""
    import json
    from pathlib import Path

    from runners.config import UNHASHED, config_hash

    config = read_record(Path(__file__).parents[1] / "RESULTS" / "records" / folder).config
    groups = [f"domain={config['domain']}", f"preset={config['preset']}", f"attention={config['attention']['variant']}"]
    composed = dict(leaves(as_dict(compose(groups))))
    overrides = [f"{key}={json.dumps(value) if not isinstance(value, str) else value}"
                 for key, value in leaves(config) if not key.startswith(UNHASHED) and composed.get(key, ...) != value]
    assert folder.endswith(config_hash(compose([*groups, *overrides])))


def leaves(tree: dict, prefix: str = ""):
    for name, value in tree.items():
        if isinstance(value, dict) and value:
            yield from leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def test_composition_order_and_print_config(toy_domain, run_args, capsys):
    cfg = compose(["domain=toy", "preset=demo", "attention=standard", "optim.lr=0.5", "trainer.max_epochs=7", *run_args])
    assert cfg.trainer.max_epochs == 7 and cfg.optim.lr == 0.5 and cfg.attention.variant == "standard"
    assert compose(["domain=toy", "preset=demo", *run_args]).trainer.max_epochs == 1  # preset over domain
    assert compose(["domain=toy", "preset=smoke", *run_args]).trainer.max_epochs == 2  # domain over base
    assert cli(["train", "domain=toy", "--print-config", "seed=3", *run_args]) == 0
    assert "seed: 3" in capsys.readouterr().out


def test_run_directory_depends_on_config_not_clock_or_output_flags(toy_domain, tmp_path):
    a = compose(["domain=toy", "seed=1", f"output_dir={tmp_path}"])
    b = compose(["domain=toy", "seed=1", f"output_dir={tmp_path}", "trainer.enable_progress_bar=false", "threads=1"])
    c = compose(["domain=toy", "seed=1", f"output_dir={tmp_path}", "optim.lr=0.1"])
    assert run_directory(a) == run_directory(b) != run_directory(c)
    assert run_directory(a).parent.name == "quest" and run_directory(a).name.startswith("seed1-")


def test_l2norm_kernel_setting_picks_the_kernel_not_the_run(toy_domain, tmp_path, monkeypatch):
    """attention.l2norm_kernel=formula runs the written-out formula (as runs recorded before the fused CPU
    kernels did), the default the fused kernels; both are the same run, so one directory."""
    from common.attention import kernels

    fused_calls = []
    apply = kernels._FusedRowNormalize.apply
    monkeypatch.setattr(kernels._FusedRowNormalize, "apply", lambda *args: fused_calls.append(1) or apply(*args))
    args = ["domain=toy", "attention=quest", "trainer.enable_progress_bar=false"]
    train([*args, "attention.l2norm_kernel=formula", f"output_dir={tmp_path}/a"])
    assert not fused_calls
    train([*args, f"output_dir={tmp_path}/b"])
    assert fused_calls
    assert run_directory(compose([*args, "attention.l2norm_kernel=formula"])) == run_directory(compose(args))


def test_same_seed_same_metrics(toy_domain, tmp_path):
    first = train(["domain=toy", f"output_dir={tmp_path}/a", "trainer.enable_progress_bar=false"])
    second = train(["domain=toy", f"output_dir={tmp_path}/b", "trainer.enable_progress_bar=false"])
    assert first.metrics == second.metrics


def test_non_finite_loss_is_a_diverged_result(toy_domain, run_args):
    record = train(["domain=toy", "task.nan_after=3", *run_args])
    assert record.status == "diverged" and record.divergence.step == 3
    assert "non-finite" in record.divergence.reason


def test_logit_bound_ends_the_run_as_diverged(toy_domain, run_args):
    record = train(["domain=toy", "probes.every_n_steps=1", "probes.max_logit_bound=0.0", *run_args])
    assert record.status == "diverged" and "max attention logit" in record.divergence.reason


def test_records_round_trip_and_reject_malformed(tmp_path):
    data = record_json("quest", 0, {"mse": 1.0})
    record = RunRecord(**data)
    assert read_record(write_record(tmp_path / "ok", record)) == record and record.to_json() == data
    with pytest.raises(RecordError, match="missing field"):
        RunRecord.from_json({})
    with pytest.raises(RecordError, match="status 'fine' is not one of ok, diverged, failed"):
        RunRecord.from_json({**data, "status": "fine"})
    with pytest.raises(ValidationError, match="status"):
        record.status = "fine"
    (tmp_path / "record.json").write_text("{not json")
    with pytest.raises(RecordError, match="not valid JSON"):
        read_record(tmp_path)
    with pytest.raises(RecordError, match="no such record"):
        read_record(tmp_path / "elsewhere")


def test_a_record_reads_its_config_by_dotted_key():
    record = RunRecord(**record_json("quest", 0, {"mse": 1.0}))
    record.config = {"optim": {"lr": 0.003}, "data": {"answer_kappa": None}}
    assert record.setting("optim.lr") == 0.003 and record.setting("optim") == {"lr": 0.003}
    assert record.setting("data.answer_kappa", 1.0) is None  # held, though null: not the default
    assert record.setting("data.p_bias.deeper", "absent") == "absent" and record.setting("model.dim") is None


def test_slurm_launcher_runs_the_array_through_submitit(toy_domain, tmp_path):
    spec = Sweep.model_validate({
        "domains": ["toy"], "variants": ["quest"], "seeds": [0, 1], "preset": "demo", "output_dir": str(tmp_path),
        "overrides": ["trainer.enable_progress_bar=false"],
        "slurm": {"partition": "gpu", "time_min": 30, "gpus_per_task": 1, "array_parallelism": 4}})
    jobs = slurm.launch_slurm(expand(spec), spec, tmp_path / "slurm", cluster="debug")
    assert [job.result()["ok"] for job in jobs] == [1, 1]
    assert len(list(tmp_path.rglob("record.json"))) == 2
    (tmp_path / "queue.yaml").write_text("domains: [toy]\nslurm: {queue: x}\n")
    with pytest.raises(ConfigError, match="queue.yaml: slurm: unknown key"):  # refused as the file is read, before any run
        load_sweep(tmp_path / "queue.yaml")


@pytest.mark.slow
def test_ddp_on_cpu_with_two_processes(tmp_path):
    """Lightning DDP (gloo) over two CPU processes: one record, written by rank 0."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "runners.cli", "train", "domain=retrieval", "preset=smoke", "trainer.strategy=ddp",
         "trainer.devices=2", "data.batch_size=16", f"output_dir={tmp_path}", "trainer.enable_progress_bar=false"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    records = list(tmp_path.rglob("record.json"))
    record = read_record(records[0])
    assert len(records) == 1 and record.status == "ok"
    assert out.stdout.count("ok: retrieval/quest") == 1  # rank 0 reports, rank 1 stays quiet
    assert record.hardware["world_size"] == 2
    # data.batch_size is the global batch: each of the two processes loads half of it
    assert record.batch.model_dump(by_alias=True) == {"global": 16, "per_device": 8, "world_size": 2, "accumulate": 1}


def test_global_batch_splits_over_devices_and_accumulation():
    assert device_batch(1024, 8, 1)["per_device"] == 128
    assert device_batch(1024, 4, 2) == {"global": 1024, "per_device": 128, "world_size": 4, "accumulate": 2}
    for world, accumulate in ((3, 1), (1, 2048)):
        with pytest.raises(ConfigError, match="does not split over"):
            device_batch(1024, world, accumulate)
    cfg = compose(["domain=vision", "preset=smoke", "data.batch_size=32", "trainer.accumulate_grad_batches=2"])
    assert check_settings(cfg)["per_device"] == 16


def test_learning_rate_schedules():
    cosine = lr_schedule(Optim(schedule="cosine", warmup_steps=10, min_lr_ratio=0.1, cooldown_steps=20), 100)
    assert [cosine(s) for s in (0, 9)] == pytest.approx([0.1, 1.0])
    assert cosine(45) == pytest.approx(0.55)  # half way from the warm-up's end to the cool-down's start
    assert [cosine(s) for s in (80, 99)] == pytest.approx([0.1, 0.1])  # the cool-down holds the minimum
    poly = lr_schedule(Optim(schedule="poly", poly_power=0.9), 100)
    assert poly(50) == pytest.approx(0.5 ** 0.9) and poly(100) == 0.0
    assert lr_schedule(Optim(schedule="constant", warmup_steps=4), 100)(50) == 1.0
    with pytest.raises(ValidationError, match="schedule"):  # the schema refuses a schedule lr_schedule lacks
        Optim(schedule="step")


def test_quest_list_names_every_domain_its_commands_and_the_variants(capsys):
    from common.attention import VARIANTS

    assert cli(["list"]) == 0
    out = capsys.readouterr().out
    assert "language" in out and "quest generate" in out and "quest imagenet" in out
    assert all(v in out for v in VARIANTS)


def test_a_reader_that_leaves_is_a_quiet_sigpipe():
    """`quest list | head`: the reader closes the pipe; the command ends as a shell's SIGPIPE would, 128 + 13,
    without a traceback."""
    import signal
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "runners.cli", "list"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    process.stdout.close()
    assert process.wait(timeout=60) == 128 + signal.SIGPIPE
    assert process.stderr.read() == b""


def test_model_bench_times_every_variant_and_the_loop_on_the_same_batches(toy_domain, capsys, tmp_path):
    """``quest bench --model``: each variant's bare step over standard's, the Lightning loop over the bare one;
    the bare loop trains (its parameters move) and the loop fits the in-memory batches it was given."""
    from runners.runs import stepbench

    args = ["domain=toy", "preset=smoke", f"output_dir={tmp_path}", f"cache_dir={tmp_path}"]
    cfg, datamodule, task = stepbench.build([*args, "attention=quest"])
    batches = stepbench.train_batches(datamodule, 6)  # the loader holds 4: it cycles
    assert len(batches) == 6 and torch.equal(batches[4][0], batches[0][0])
    before = [p.detach().clone() for p in task.parameters()]
    stepbench.bare_loop(cfg, task, batches)()
    assert all(not torch.equal(a, b) for a, b in zip(before, task.parameters()))
    loop, timed = stepbench.lightning_loop(cfg, stepbench.build(args)[2], batches, skip=1, folder=tmp_path / "loop")
    loop()
    assert len(timed) == 1 and timed[0] > 0
    result = stepbench.measure(args, ["standard", "quest"], steps=2, rounds=2)
    assert result["ratio"]["standard"] == 1.0 and result["ratio"]["quest"] > 0 and result["loop_overhead"] > 0
    assert cli(["bench", "--model", *args, "--steps", "2", "--repeats", "1", "--json", str(tmp_path / "b.json")]) == 0
    assert "domain=toy preset=smoke" in capsys.readouterr().out


def test_fixed_cost_splits_a_fresh_process_run_into_its_parts():
    from runners.runs.stepbench import fixed_cost

    result = fixed_cost(["domain=retrieval", "preset=smoke"])
    parts = result["parts_s"]
    assert list(parts) == ["start and imports", "build", "fit (train + validate)", "checkpoints", "test", "record and exit"]
    assert sum(parts.values()) == pytest.approx(result["wall_s"]) and min(parts.values()) >= 0
    assert 0 < result["fixed_share"] < 1 and result["steps"] > 0
