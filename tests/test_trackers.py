"""Experiment tracking (runners.runs.trackers): MLflow and W&B, offline, off by default. A tracker run holds the
record's config, headline metrics and the record itself, and ends as the run did; tracking settings leave the
run's identity alone; a tracker turned on without its package is a one-line error; the launch log says where
a sweep's runs were tracked."""
import json
import struct
import sys
import time

import pytest
from conftest import Threaded, ToyTask, make_record

from common.records import read_record, write_record
from runners.cli import main as cli
from runners.commands import sweep
from runners.config import compose, run_directory
from runners.runs import trackers
from runners.runs.launches import describe_launches, read_launches
from runners.runs.training import train
from runners.sweeps import workers

SMOKE = ["domain=toy", "preset=smoke"]


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No tracker can reach a network: W&B told offline by its environment too, any proxied request refused
    at once (rather than retried), nothing written outside tmp_path."""
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path),
                        "WANDB_CONSOLE": "off", "WANDB_INIT_TIMEOUT": "30", "MLFLOW_ALLOW_FILE_STORE": "true",
                        "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def mlflow_settings(tmp_path) -> list[str]:
    return ["logging.mlflow.enabled=true", f"logging.mlflow.tracking_uri=file:{tmp_path / 'mlruns'}",
            "logging.mlflow.experiment=quest-test"]


def wandb_settings(tmp_path) -> list[str]:
    return ["logging.wandb.enabled=true", "logging.wandb.project=quest-test", f"logging.wandb.dir={tmp_path}"]


def mlflow_run(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"file:{tmp_path / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name("quest-test").experiment_id])
    return client, run


def wandb_records(path):
    """The records of a W&B run file (``.wandb``: a LevelDB-style log of protobuf records, 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, pending = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # block padding
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last part of one
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_run(tmp_path, wait: float = 20.0) -> dict:
    """The one offline W&B run under tmp_path: its folder, name, config, summary and exit code. W&B's service
    process may still be writing the file when the run returns, on a loaded machine: read it again, for up to
    ``wait`` seconds, until it holds the run and its exit."""
    (folder,) = (tmp_path / "wandb").glob("offline-run-*")
    (log,) = folder.glob("*.wandb")
    deadline = time.monotonic() + wait
    while not {"name", "exit_code"} <= set(run := _read_wandb_run(folder, log)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return run


def _read_wandb_run(folder, log) -> dict:
    run = {"folder": folder, "config": {}, "summary": {}}
    for record in wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run["name"] = record.run.display_name
            updates = record.run.config.update
        elif kind in ("config", "summary"):
            updates = record.config.update if kind == "config" else record.summary.update
        elif kind == "exit":
            run["exit_code"] = record.exit.exit_code
            continue
        else:
            continue
        for item in updates:
            key = item.key or ".".join(item.nested_key)
            run["config" if kind in ("run", "config") else "summary"][key] = json.loads(item.value_json)
    return run


def test_an_offline_mlflow_run_holds_the_config_headline_and_record(toy_domain, run_args, tmp_path, offline):
    started = time.perf_counter()
    args = [*SMOKE, *run_args, *mlflow_settings(tmp_path)]
    record = train(args)
    run_dir = run_directory(compose(args))
    saved = read_record(run_dir)
    assert record.status == saved.status == "ok"
    client, run = mlflow_run(tmp_path)
    assert run.info.status == "FINISHED" and run.info.run_name == f"toy/quest/{run_dir.name}"
    tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
    assert tags["quest.run_dir"] == str(run_dir) and tags["quest.status"] == "ok" and tags["quest.primary_metric"] == "mse"
    assert params["optim.lr"] == str(saved.setting("optim.lr")) and params["seed"] == "0"
    assert params["logging.mlflow.experiment"] == "quest-test"
    assert saved.metrics and all(metrics[key] == value for key, value in saved.metrics.items())
    assert metrics["best_val"] == saved.best_val.value and metrics["wall_time_s"] == saved.wall_time_s
    history = client.get_metric_history(run.info.run_id, "test/mse")  # logged once, by Lightning, as tested
    assert [metric.value for metric in history] == [saved.metrics["test/mse"]]
    artifact = client.download_artifacts(run.info.run_id, trackers.ARTIFACT, str(tmp_path))
    assert json.loads(open(artifact).read()) == saved.to_json()
    assert not list((tmp_path / "runs").rglob("mlruns"))  # the store is outside the run directory
    assert time.perf_counter() - started < 30


def test_an_offline_wandb_run_holds_the_config_headline_and_record(toy_domain, run_args, tmp_path, offline):
    started = time.perf_counter()
    args = [*SMOKE, *run_args, *wandb_settings(tmp_path)]
    train(args)
    run_dir = run_directory(compose(args))
    saved = read_record(run_dir)
    run = wandb_run(tmp_path)
    assert run["name"] == f"toy/quest/{run_dir.name}" and run["exit_code"] == 0
    assert run["config"]["optim.lr"] == saved.setting("optim.lr") and run["config"]["seed"] == 0
    summary = run["summary"]
    assert summary["status"] == "ok" and summary["primary_metric"] == "mse"
    assert saved.metrics and all(summary[key] == value for key, value in saved.metrics.items())
    assert json.loads((run["folder"] / "files" / trackers.ARTIFACT).read_text()) == saved.to_json()
    assert time.perf_counter() - started < 30


def test_a_failed_run_ends_its_tracker_runs_as_failed(toy_domain, run_args, tmp_path, offline, monkeypatch):
    def broken(self, *args):
        raise RuntimeError("the loss exploded in an unexpected way")

    monkeypatch.setattr(ToyTask, "loss", broken)
    args = [*SMOKE, *run_args, *mlflow_settings(tmp_path), *wandb_settings(tmp_path)]
    assert cli(["train", *args]) == 1
    saved = read_record(run_directory(compose(args)))
    assert saved.status == "failed"
    _, run = mlflow_run(tmp_path)
    assert run.info.status == "FAILED" and run.data.tags["quest.status"] == "failed"
    assert "unexpected way" in run.data.tags["quest.error"]
    wandb = wandb_run(tmp_path)
    assert wandb["exit_code"] == 1 and wandb["summary"]["status"] == "failed"


def test_tracking_settings_leave_the_run_directory_alone(toy_domain, tmp_path):
    plain = compose([*SMOKE, f"output_dir={tmp_path}"])
    tracked = compose([*SMOKE, f"output_dir={tmp_path}", *mlflow_settings(tmp_path), *wandb_settings(tmp_path),
                       "logging.wandb.mode=online", "logging.tensorboard=true"])
    assert not trackers.enabled(plain) and trackers.enabled(tracked) == ["mlflow", "wandb"]
    assert run_directory(plain) == run_directory(tracked)
    assert run_directory(plain) != run_directory(compose([*SMOKE, f"output_dir={tmp_path}", "optim.lr=0.5"]))


@pytest.mark.parametrize("tracker", trackers.TRACKERS)
def test_a_tracker_without_its_package_is_a_one_line_error_before_any_run_directory(
        toy_domain, run_args, tmp_path, capsys, monkeypatch, tracker):
    monkeypatch.setitem(sys.modules, tracker, None)  # `import <tracker>` fails, as when it is not installed
    assert cli(["train", *SMOKE, *run_args, f"logging.{tracker}.enabled=true"]) == 2
    err = capsys.readouterr().err
    assert f"logging.{tracker}.enabled=true needs {tracker}" in err and "pip install 'quest-study[tracking]'" in err
    assert err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


def test_tracking_settings_are_checked(toy_domain, run_args, tmp_path, capsys):
    assert cli(["train", *SMOKE, *run_args, "logging.wandb.enabled=true", "logging.wandb.mode=cloud"]) == 2
    err = capsys.readouterr().err
    assert "unknown logging.wandb.mode='cloud'; choose from offline, online" in err and err.count("\n") == 1
    assert cli(["train", *SMOKE, *run_args, "logging.mlflow.experimnt=x"]) == 2
    assert "did you mean logging.mlflow.experiment?" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_the_launch_log_says_where_the_sweep_tracked_its_runs(toy_domain, tmp_path, monkeypatch):
    monkeypatch.setattr(workers, "_spawn", Threaded)

    def run(cfg, **options):  # the runner, made instant: a record, no training
        record = make_record(cfg.attention.variant, cfg.seed, {"mse": 1.0}, domain=cfg.domain, dataset="random")
        write_record(run_directory(cfg), record)
        return record

    monkeypatch.setattr("runners.runs.training.run", run)
    spec = {"domains": ["toy"], "variants": ["quest"], "seeds": [0, 1], "preset": "smoke",
            "output_dir": str(tmp_path / "runs"), "overrides": [*mlflow_settings(tmp_path), *wandb_settings(tmp_path)]}
    (tmp_path / "sweep.yaml").write_text(json.dumps(spec))
    assert sweep.main([str(tmp_path / "sweep.yaml")]) == 0
    (launch,) = read_launches(tmp_path / "runs")
    assert launch.trackers == {"mlflow": f"file:{tmp_path / 'mlruns'} / quest-test",
                                  "wandb": f"quest-test (offline, {tmp_path / 'wandb'})"}
    header = "\n".join(describe_launches([launch]))
    assert f"tracked in MLflow file:{tmp_path / 'mlruns'} / quest-test, W&B quest-test (offline," in header
    assert sweep.main([str(tmp_path / "sweep.yaml")]) == 0  # nothing left to run: nothing sent anywhere
    assert read_launches(tmp_path / "runs")[-1].trackers == {}
