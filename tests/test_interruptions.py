"""A run stopped on purpose, killed, rerun, or started twice (README, "When things go wrong"): SIGTERM and
SIGINT stop `quest train` in one line with exit 143 / 130 and a `stopped` record; a rerun that is killed or
stopped leaves the earlier result exactly as it was; a run another process holds is refused or waited for."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import pytorch_lightning as pl
from conftest import make_record
from pytorch_lightning.demos.boring_classes import BoringModel

from common.errors import Stopped
from common.records import read_record, write_record
from runners.cli import main as cli
from runners.config import compose, run_directory
from runners.runs.rundir import build_path, claimed

LONG = ["domain=retrieval", "preset=smoke", "trainer.max_epochs=100000", "trainer.enable_progress_bar=false",
        "threads=1"]


def start_training(tmp_path):
    """`quest train` of a long run in its own process, returned once it is training (its first checkpoint
    is written), with the run's directory."""
    args = [*LONG, f"output_dir={tmp_path / 'runs'}", f"cache_dir={tmp_path / 'cache'}"]
    process = subprocess.Popen([sys.executable, "-m", "runners.cli", "train", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    run_dir = run_directory(compose(args))
    deadline = time.monotonic() + 120
    while not (build_path(run_dir) / "checkpoints" / "last.ckpt").exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the run never started training"
        time.sleep(0.1)
    return process, run_dir


def earlier_result(run_dir):
    """A finished run's directory as a rerun finds it; returns its files and their bytes."""
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "best.ckpt").write_bytes(b"the earlier weights")
    write_record(run_dir, make_record("quest", 0, {"acc": 0.5}, domain="retrieval"))
    return contents(run_dir)


def contents(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stopped_run_says_so_in_one_line_and_records_the_step(tmp_path, signum, code):
    process, run_dir = start_training(tmp_path)
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    name = signal.Signals(signum).name
    assert process.returncode == code, err
    assert err.startswith(f"quest: stopped by {name}: stopped by {name} at step ") and err.count("\n") == 1, err
    record = read_record(run_dir)  # a scheduler's preemption, told apart from a crash
    assert record.status == "stopped" and record.stopped.signal == name and record.stopped.step > 0
    assert record.error == f"stopped by {name} at step {record.stopped.step}"
    assert not build_path(run_dir).exists()


@pytest.mark.parametrize("stop", ["kill", "term"])
def test_a_rerun_that_is_killed_or_stopped_leaves_the_earlier_result_as_it_was(tmp_path, stop):
    args = [*LONG, f"output_dir={tmp_path / 'runs'}", f"cache_dir={tmp_path / 'cache'}"]
    before = earlier_result(run_directory(compose(args)))
    process, run_dir = start_training(tmp_path)
    process.send_signal(signal.SIGKILL if stop == "kill" else signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert contents(run_dir) == before
    if stop == "term":
        assert process.returncode == 143 and f"the earlier result in {run_dir} is kept" in err, err
        assert not build_path(run_dir).exists()


def test_a_run_another_process_holds_is_refused_or_waited_for(toy_domain, run_args, capsys):
    run_dir = run_directory(compose(["domain=toy", *run_args]))
    with claimed(run_dir) as mine:  # as a sweep's worker or another `quest train` holds it
        assert mine
        assert cli(["train", "domain=toy", *run_args]) == 2
        err = capsys.readouterr().err
        assert f"{run_dir} is being run by another process" in err and "--wait" in err and err.count("\n") == 1
        assert not run_dir.exists()
        codes = []
        waiting = threading.Thread(target=lambda: codes.append(cli(["train", "domain=toy", *run_args, "--wait"])))
        waiting.start()
        time.sleep(1.0)
        assert waiting.is_alive() and not run_dir.exists()  # waits while the lock is held
    waiting.join(120)
    assert codes == [0] and read_record(run_dir).status == "ok"


def test_a_finished_rerun_replaces_the_earlier_result(toy_domain, run_args):
    run_dir = run_directory(compose(["domain=toy", *run_args]))
    earlier_result(run_dir)
    assert cli(["train", "domain=toy", *run_args]) == 0
    assert read_record(run_dir).domain == "toy"
    assert (run_dir / "checkpoints" / "best.ckpt").read_bytes() != b"the earlier weights"
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["best.ckpt", "last.ckpt"]
    assert [p.name for p in run_dir.parent.iterdir() if not p.name.endswith(".lock")] == [run_dir.name]


class SigtermAfterFirstStep(pl.Callback):
    def on_train_batch_end(self, *args):
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_second_sigterm_after_lightnings_teardown_does_not_cut_short_the_recording_of_the_first(tmp_path):
    # A sweep's worker gets SIGTERM twice: from the process group, then from its launcher passing it on.
    # Lightning's teardown puts back the handler it found, so the second one lands while the run is recorded.
    trainer = pl.Trainer(max_steps=100, callbacks=[SigtermAfterFirstStep()], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    recorded = False
    with Stopped.on_signals():
        with pytest.raises(Stopped) as stop:
            trainer.fit(BoringModel())
        os.kill(os.getpid(), signal.SIGTERM)
        recorded = True
    assert recorded and stop.value.name == "SIGTERM" and trainer.global_step == 1


@pytest.mark.slow
def test_sigterm_to_a_sweeps_process_group_records_its_runs_as_stopped(tmp_path):
    spec = tmp_path / "long.yaml"
    spec.write_text(json.dumps({"domains": ["retrieval"], "variants": ["quest", "standard"], "seeds": [0],
                                "preset": "smoke", "output_dir": str(tmp_path / "runs"),
                                "overrides": [f"cache_dir={tmp_path / 'cache'}", *LONG[2:]]}))
    sweep = subprocess.Popen([sys.executable, "-m", "runners.cli", "sweep", str(spec), "--workers", "2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("runs/retrieval/*/.*.partial/checkpoints/last.ckpt"))) < 2:
        assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate()
        time.sleep(0.1)
    os.killpg(sweep.pid, signal.SIGTERM)  # as a scheduler stops a job: every process of the group
    out, err = sweep.communicate(timeout=60)
    assert sweep.returncode == 143, err
    assert err == ("quest: stopped by SIGTERM: 2 run(s) recorded as stopped, the finished ones kept; launch the "
                   "sweep again to finish it\n")  # one line, from the launcher alone
    records = [read_record(path) for path in tmp_path.glob("runs/retrieval/*/seed0-*/record.json")]
    assert [r.status for r in records] == ["stopped", "stopped"]
    launch = json.loads((tmp_path / "runs" / "launches.jsonl").read_text())
    assert not launch["finished"] and launch["ran"]["stopped"] == 2
