"""`quest sweep`: exit status, reruns, run locks under contention, and the sweep's one progress line."""
import faulthandler
import json
import logging
import os
import re
import signal
import sys
import time
from contextlib import contextmanager
from types import SimpleNamespace

import conftest
import pytest
from conftest import DAMAGED, FORK, Forked, damage, forked_worker, make_record

import runners.runs.robust_accuracy  # noqa: F401  (loaded before forking: sweep imports it for every run)
from common.attention import VARIANTS
from common.errors import DataError, Stopped
from common.records import RunRecord, read_record, write_record
from runners.cli import main as cli
from runners.commands import sweep
from runners.config import compose, run_directory
from runners.runs.rundir import lock_path
from runners.sweeps import slurm, workers
from runners.sweeps import spec as sweep_spec
from runners.sweeps.progress import Progress

pytestmark = pytest.mark.usefixtures("threaded_workers")


def write_spec(tmp_path, **spec) -> str:
    spec = {"domains": ["toy"], "variants": ["quest"], "seeds": [0], "preset": "demo",
            "output_dir": str(tmp_path / "runs"),
            "overrides": [f"cache_dir={tmp_path / 'cache'}", "trainer.enable_progress_bar=false"], **spec}
    path = tmp_path / "sweep.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return str(path)


def one_run(tmp_path, seed: int = 0) -> list[str]:
    return ["domain=toy", "attention=quest", f"seed={seed}", f"output_dir={tmp_path / 'runs'}"]


def fake_record(cfg, status: str, **fields) -> RunRecord:
    fields = {"error": "RuntimeError: broken" if status == "failed" else None, "divergence": None, **fields}
    return make_record(cfg.attention.variant, cfg.seed, {}, domain=cfg.domain, status=status, **fields)


def recorded(tmp_path) -> dict[int, str]:
    return {r.seed: r.status for r in map(read_record, tmp_path.rglob("record.json"))}


@pytest.fixture
def fake_run(monkeypatch, tmp_path):
    """The runner replaced by one that logs "<seed> <pid>" per run, takes `delay` seconds and ends as
    `statuses[seed]` says: ok (the default), diverged or failed with a record; "invalid" raises DataError and
    "crash" a RuntimeError, with no record, as the runner does for bad input and for a bug outside its record;
    "segfault" kills its process with SIGSEGV."""
    log = tmp_path / "executions"
    fake = SimpleNamespace(statuses={}, delay=0.0)

    def run(cfg, **options):
        with open(log, "a") as f:
            f.write(f"{cfg.seed} {os.getpid()}\n")
        status = fake.statuses.get(cfg.seed, "ok")
        if status == "segfault":  # as a native library's crash kills the process
            faulthandler.disable()  # pytest's would print the stack first
            os.kill(os.getpid(), signal.SIGSEGV)
        if status in ("invalid", "crash"):  # at once, as bad input is found before training
            raise DataError("data file broken") if status == "invalid" else RuntimeError("bug\nmore lines")
        time.sleep(fake.delay)
        record = fake_record(cfg, status)
        write_record(run_directory(cfg), record)
        return record

    def executions(column=0):
        return [int(line.split()[column]) for line in log.read_text().splitlines()] if log.exists() else []

    fake.executions = executions
    monkeypatch.setattr("runners.runs.training.run", run)
    return fake


@pytest.fixture
def toy_breaks(monkeypatch):
    """The toy task raises while training when task.nan_after=-2: a run that fails at run time."""
    loss = conftest.ToyTask.loss

    def breaking(self, pred, target, stage):
        if self.nan_after == -2:
            raise RuntimeError("toy training broke")
        return loss(self, pred, target, stage)

    monkeypatch.setattr(conftest.ToyTask, "loss", breaking)


@pytest.mark.parametrize("grid, code, statuses, listed", [
    ({"task.nan_after": [-1, 0]}, 0, {"ok", "diverged"}, None),  # divergence is a result
    ({"task.nan_after": [-1, -2]}, 1, {"ok", "failed"}, "failed toy/quest seed 0: RuntimeError: toy training broke"),
    ({"data.n": [64, "many"]}, 2, {"ok"}, "invalid toy/quest seed 0: ConfigError: config key 'data.n'"),
])
def test_exit_status_tells_ok_from_failed_from_invalid(toy_domain, toy_breaks, tmp_path, capsys, grid, code,
                                                       statuses, listed):
    assert sweep.main([write_spec(tmp_path, grid=grid)]) == code
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].startswith("sweep: finished, 2/2 done: ")
    assert {r.status for r in map(read_record, tmp_path.rglob("record.json"))} == statuses  # invalid: no record
    if listed:  # reported as it happens and again in the closing list
        assert err.count(listed) == 2 and "sweep: 1 run(s) failed or invalid:\n  " + listed in err
    else:
        assert err == ""


@pytest.mark.parametrize("status, code, listed", [
    ("invalid", 2, "  invalid toy/quest seed 1: DataError: data file broken"),
    ("crash", 1, "  failed toy/quest seed 1: RuntimeError: bug -> "),  # one line, and the sweep goes on
])
def test_runner_errors_without_a_record(toy_domain, tmp_path, fake_run, capsys, status, code, listed):
    spec = write_spec(tmp_path, seeds=[0, 1, 2])
    fake_run.statuses[1] = status
    assert sweep.main([spec]) == code
    assert recorded(tmp_path) == {0: "ok", 2: "ok"}
    assert listed in capsys.readouterr().err
    del fake_run.statuses[1]  # the cause is fixed
    assert sweep.main([spec]) == 0 and recorded(tmp_path) == {0: "ok", 1: "ok", 2: "ok"}


def test_rerun_retries_failed_runs_keeps_the_others_and_redo_forces_them(toy_domain, tmp_path, fake_run):
    spec = write_spec(tmp_path, seeds=[0, 1, 2])
    fake_run.statuses.update({1: "diverged", 2: "failed"})
    assert sweep.main([spec]) == 1
    fake_run.statuses[2] = "ok"  # the cause of the failure is fixed
    assert sweep.main([spec]) == 0
    assert fake_run.executions() == [0, 1, 2, 2]
    assert recorded(tmp_path) == {0: "ok", 1: "diverged", 2: "ok"}
    assert sweep.main([spec, "--redo", "diverged"]) == 0
    assert fake_run.executions()[4:] == [1]
    assert sweep.main([spec, "--redo", "all"]) == 0
    assert fake_run.executions()[5:] == [0, 1, 2]
    assert sweep.main([spec]) == 0 and len(fake_run.executions()) == 8


def test_each_launch_is_logged_and_aggregate_states_how_the_runs_were_made(toy_domain, tmp_path, fake_run,
                                                                           monkeypatch):
    from runners.runs.launches import describe_launches, read_launches

    spec = write_spec(tmp_path, seeds=[0, 1])
    fake_run.statuses[1] = "diverged"
    assert sweep.main([spec]) == 0
    assert sweep.main([spec]) == 0  # the second launch finds everything recorded
    first, second = read_launches(tmp_path / "runs")
    assert first.command == f"quest sweep {spec}" and first.workers == 1
    assert first.ran == {"ok": 1, "diverged": 1, "failed": 0, "invalid": 0, "stopped": 0}
    assert second.ran == {"ok": 0, "diverged": 0, "failed": 0, "invalid": 0, "stopped": 0}
    assert first.hardware.cpus == os.cpu_count() and first.wall_s >= 0
    assert first.finished and second.finished
    header = "\n".join(describe_launches([first, second]))
    assert header.startswith("How these runs were made (2 sweep launches,")
    assert "ran 1 ok, 1 diverged;" in header and "ran nothing (every run was recorded)" in header
    # a launch stopped with Ctrl-C is logged as such, with the runs it finished
    def stop_after_the_first_run(progress, outcome):
        progress.add(outcome)
        raise KeyboardInterrupt

    monkeypatch.setattr(Progress, "update", stop_after_the_first_run)
    with pytest.raises(Stopped) as stop:
        sweep.main([spec, "--redo", "all"])
    assert stop.value.exit_code == 130
    stopped = read_launches(tmp_path / "runs")[-1]  # the worker (a thread: it cannot be stopped) finished both
    assert not stopped.finished and stopped.ran == {"ok": 1, "diverged": 1, "failed": 0, "invalid": 0, "stopped": 0}
    assert "(stopped before the end)" in "\n".join(describe_launches([stopped]))


def test_one_run_hammered_by_many_processes_runs_once(toy_domain, tmp_path, fake_run):
    """Processes that keep trying the same run, from the same moment, over a lock left by a dead one; in
    several rounds, one run directory each, since a race may need a few tries to show."""
    rounds = [one_run(tmp_path, seed) for seed in range(6)]
    run_dirs = [run_directory(compose(args)) for args in rounds]
    for run_dir in run_dirs:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        (run_dir.parent / f".{run_dir.name}.lock").write_text(f"{os.uname().nodename} 999999999")
    fake_run.delay = 0.1
    start = FORK.Barrier(8)

    def worker():
        for args, run_dir in zip(rounds, run_dirs):
            start.wait()
            deadline = time.monotonic() + 10
            while not (run_dir / "record.json").exists() and time.monotonic() < deadline:
                workers.run_all([args])
                time.sleep(0.01)

    processes = [FORK.Process(target=worker) for _ in range(8)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(30)
    assert [p.exitcode for p in processes] == [0] * 8
    assert fake_run.executions() == list(range(6))


def finished_meanwhile(monkeypatch, args: list[str], status: str) -> None:
    """Another process finishes the run ``args`` as ``status`` and lets it go just before a worker takes its lock."""
    claimed = workers.claimed

    @contextmanager
    def finished_first(run_dir):
        write_record(run_dir, fake_record(compose(args), status))
        with claimed(run_dir) as mine:
            yield mine

    monkeypatch.setattr(workers, "claimed", finished_first)


def test_the_record_is_read_after_the_lock_is_taken(toy_domain, tmp_path, fake_run, monkeypatch):
    """Another process finishes the run and lets it go just before this one takes its lock: not run again."""
    args = one_run(tmp_path)
    finished_meanwhile(monkeypatch, args, "ok")
    assert workers.run_all([args])["skipped"] == 1
    assert fake_run.executions() == []


def test_a_run_another_worker_just_failed_is_reported_with_its_error(toy_domain, tmp_path, fake_run, monkeypatch):
    """The worker that made a failed run may report it after another worker found it settled: whichever word the
    launcher hears first (the first stands), it carries the run's error."""
    args, reported = one_run(tmp_path), []
    finished_meanwhile(monkeypatch, args, "failed")
    workers.run_all([args], report=reported.append)
    assert [(o["status"], o["error"]) for o in reported] == [("failed", "RuntimeError: broken")]
    assert fake_run.executions() == []


@pytest.mark.parametrize("note", ['["failed", "Runtime', '["failed", "x", 3]', '[1, 2]'])
def test_a_spoilt_lock_note_is_no_outcome_and_the_run_is_made(toy_domain, tmp_path, fake_run, note):
    args = one_run(tmp_path)
    run_dir = run_directory(compose(args))
    run_dir.mkdir(parents=True)
    lock_path(run_dir).write_text(note)
    assert workers.run_all([args])["ok"] == 1
    assert fake_run.executions() == [0]


def test_a_lock_dies_with_its_holder(toy_domain, tmp_path, fake_run):
    args = one_run(tmp_path)
    run_dir = run_directory(compose(args))
    held = FORK.Event()

    def hold():
        with workers.claimed(run_dir) as mine:
            if mine:
                held.set()
                time.sleep(60)

    holder = FORK.Process(target=hold)
    holder.start()
    assert held.wait(10)
    assert workers.run_all([args])["busy"] == 1  # a live holder keeps it
    os.kill(holder.pid, signal.SIGKILL)  # as a sweep killed with SIGKILL: no clean-up
    holder.join()
    assert workers.run_all([args])["ok"] == 1
    assert fake_run.executions() == [0]


def outcome(index, status, wall_s=None, **rest):
    return {"index": index, "status": status, "error": None, "run_dir": None, "wall_s": wall_s, **rest}


def test_progress_line_changes_only_with_the_counts(capsys):
    progress = Progress([["domain=toy", "attention=quest", f"seed={s}"] for s in range(4)], workers=2)
    progress.show()
    progress.update(outcome(0, "ok", 120.0))
    progress.update(outcome(0, "ok"))  # the same run found recorded by another worker
    progress.update(outcome(1, "busy"))  # held by another worker, which will report it
    progress.update(outcome(1, "failed", 60.0, error="RuntimeError: boom", run_dir="runs/r1"))
    progress.show()
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "sweep: 0/4 done · 0 diverged · 0 failed · eta –",
        "sweep: 1/4 done · 0 diverged · 0 failed · eta 3 min",  # 120 s × 3 left / 2 workers
        "sweep: 2/4 done · 0 diverged · 1 failed · eta 2 min",  # 90 s × 2 left / 2 workers, rounded up
    ]
    assert err == "sweep: failed toy/quest seed 1: RuntimeError: boom -> runs/r1\n"
    assert progress.code() == 1


def test_a_run_made_after_another_worker_could_not_compose_it_counts_as_made(capsys):
    """A config file edited while a sweep runs: one worker reads it half-written (invalid, no run directory),
    another composes it a moment later and makes the run. The launch counts the run that was made."""
    progress = Progress([["domain=toy", "attention=quest", "seed=0"]], workers=2)
    progress.add(outcome(0, "invalid", error="ConfigError: unknown preset 'demo'"))
    progress.add(outcome(0, "ok", 30.0, run_dir="runs/r0"))
    progress.add(outcome(0, "invalid", error="ConfigError: unknown preset 'demo'"))  # too late to count
    assert (progress.count("ok"), progress.count("invalid"), progress.code()) == (1, 0, 0)


def test_workers_run_the_sweep_and_only_the_parent_prints(toy_domain, tmp_path, fake_run, monkeypatch, capfd):
    monkeypatch.setattr(workers, "_spawn", forked_worker)
    fake_run.statuses.update({1: "failed", 2: "invalid"})
    fake_run.delay = 0.2
    assert sweep.main([write_spec(tmp_path, seeds=[0, 1, 2, 3, 4]), "--workers", "2"]) == 2
    out, err = capfd.readouterr()
    *lines, summary = out.splitlines()
    assert summary == "sweep: finished, 5/5 done: 3 ok · 0 diverged · 1 failed · 1 invalid"
    assert lines[0] == "sweep: 0/5 done · 0 diverged · 0 failed · eta –"
    line = re.compile(r"sweep: [1-5]/5 done · 0 diverged · [01] failed( · 1 invalid)? · eta (\d+ min|–)")
    assert all(line.fullmatch(text) for text in lines[1:])
    done = [int(line.split()[1].split("/")[0]) for line in lines]
    assert done == sorted(set(done)) and done[-1] == 5  # one count, rising: no worker prints its own
    assert err.count("failed toy/quest seed 1: RuntimeError: broken") == 2  # as it happened, and in the list
    assert err.count("invalid toy/quest seed 2: DataError: data file broken") == 2
    assert sorted(fake_run.executions()) == [0, 1, 2, 3, 4]  # the invalid run too: tried once, not per worker
    assert len(set(fake_run.executions(column=1)) - {os.getpid()}) == 2  # run by both workers, not the parent


def test_workers_take_their_share_of_the_cores_or_the_threads_asked_for(toy_domain, tmp_path, fake_run, monkeypatch):
    spawned = []

    def spawn(cmd, env, report_fd):
        spawned.append((cmd[cmd.index("--set") + 1], env["OMP_NUM_THREADS"]))
        return conftest.Threaded(cmd, env, report_fd)

    monkeypatch.setattr(workers, "_spawn", spawn)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    spec = write_spec(tmp_path, seeds=[0])
    assert sweep.main([spec, "--workers", "2", "--redo", "all"]) == 0  # one run: one worker, all four cores
    assert sweep.main([spec, "--threads", "1", "--redo", "all"]) == 0  # beside another sweep
    assert spawned == [("threads=4", "4"), ("threads=1", "1")]


def test_slurm_launch_submits_only_the_runs_left(toy_domain, tmp_path, fake_run, monkeypatch, capsys):
    sbatch = tmp_path / "bin" / "sbatch"  # as on a SLURM cluster (launch_slurm, which would call it, is faked)
    sbatch.parent.mkdir()
    sbatch.write_text("#!/bin/sh\nexit 1\n")
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{sbatch.parent}{os.pathsep}{os.environ['PATH']}")
    assert sweep.main([write_spec(tmp_path, seeds=[0])]) == 0
    submitted = []
    monkeypatch.setattr(slurm, "launch_slurm",
                        lambda runs, *_: submitted.extend(runs) or [SimpleNamespace(job_id="42_0")])
    spec = write_spec(tmp_path, seeds=[0, 1], grid={"data.n": [64, "many"]})
    assert sweep.main([spec, "--launcher", "slurm"]) == 2  # seed 0 is recorded; the "many" runs are invalid
    assert [args[2] for args in submitted] == ["seed=1"] and "data.n=64" in submitted[0]
    assert "submitted 1 runs as array job 42" in capsys.readouterr().out


def test_a_worker_that_dies_fails_the_sweep(toy_domain, tmp_path, fake_run, monkeypatch, capsys):
    monkeypatch.setattr(workers, "_spawn", lambda *_: Forked(lambda: os.kill(os.getpid(), signal.SIGKILL)))
    assert sweep.main([write_spec(tmp_path, seeds=[0, 1]), "--workers", "2"]) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith("sweep: finished, 0/2 done: ")


def test_all_variants_leave_ablations_out_unless_asked(toy_domain):
    spec = {"domains": ["toy"], "variants": "all", "seeds": [0]}
    assert {run[1] for run in sweep_spec.expand(sweep_spec.Sweep.model_validate(spec))} == {f"attention={v}" for v in VARIANTS}
    with_ablation = sweep_spec.expand(sweep_spec.Sweep.model_validate({**spec, "ablations": ["uniform"]}))
    assert {run[1] for run in with_ablation} == {f"attention={v}" for v in [*VARIANTS, "uniform"]}


def test_sigterm_stops_a_background_launch_and_logs_it(toy_domain, tmp_path, fake_run, monkeypatch):
    """A launch run in the background ignores SIGINT; SIGTERM stops it and its workers, logged."""
    from runners.runs.launches import read_launches

    monkeypatch.setattr(workers, "_spawn", forked_worker)
    fake_run.delay = 30.0
    spec = write_spec(tmp_path, seeds=[0])
    launcher = FORK.Process(target=lambda: sys.exit(cli(["sweep", spec])))
    launcher.start()
    deadline = time.monotonic() + 20
    while not fake_run.executions() and time.monotonic() < deadline:  # the run has started
        time.sleep(0.05)
    os.kill(launcher.pid, signal.SIGTERM)
    launcher.join(20)
    assert launcher.exitcode == 143  # stopped on purpose by SIGTERM: neither ok nor a crash
    (stopped,) = read_launches(tmp_path / "runs")
    assert not stopped.finished and stopped.ran["ok"] == 0


@pytest.mark.parametrize("text, message", [
    ("domains: [toy\n", "not valid YAML"),
    ("- toy\n- quest\n", "a sweep file is a mapping of sweep keys"),
    ("", "this one is empty"),
    ("domains: [toy]\nseeds: 3\n", "seeds: must be a non-empty list of seeds from 0 to 4294967295, got 3"),
    ("domains: [toy]\ngrid: {optim.lr: 0.1}\n", "grid: must map config keys to non-empty lists of values"),
    ("domains: []\n", "domains: must be a non-empty list of names or all, got []"),
    ("domains: retrieval\n", "domains: must be a non-empty list of names or all, got 'retrieval'"),
    ("domains: [toy]\noverrides: optim.lr=0.1\n", "overrides: must be a list of key=value strings"),
    ("domains: [toy]\nrobustness: maybe\n", "robustness: must be true or false"),
    ("domains: [toy, toyy]\n", "domains: has unknown domain toyy; choose from "),
    ("domains: [toy]\ndomain_overrides: {vision: [a=1]}\n", "domain_overrides: names vision, which the sweep does not run"),
    ("domains: [toy]\nseeds: [0]\nfoo: 1\nbar: 2\n", "unknown key(s) foo, bar"),
])
def test_a_sweep_file_it_cannot_mean_is_one_line_naming_file_and_key(toy_domain, tmp_path, capsys, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert cli(["sweep", str(path), "--output-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert f"quest: error: {path}: " in err and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


def test_a_sweep_needs_at_least_one_worker(capsys):
    with pytest.raises(SystemExit) as stop:
        sweep.main(["demo", "--workers", "0"])
    assert stop.value.code == 2 and "--workers: must be a whole number >= 1, got '0'" in capsys.readouterr().err


def test_a_run_that_kills_its_worker_fails_and_the_sweep_goes_on(toy_domain, tmp_path, fake_run, monkeypatch, capsys):
    from runners.runs.launches import read_launches

    monkeypatch.setattr(workers, "_spawn", forked_worker)
    fake_run.statuses[1] = "segfault"
    spec = write_spec(tmp_path, seeds=[0, 1, 2])
    assert sweep.main([spec]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "sweep: finished, 3/3 done: 2 ok · 0 diverged · 1 failed · 0 invalid"
    assert "failed toy/quest seed 1: killed by signal 11 (SIGSEGV)" in err
    assert recorded(tmp_path) == {0: "ok", 1: "failed", 2: "ok"}  # a new worker took the dead one's place
    (killed,) = [r for r in map(read_record, tmp_path.rglob("record.json")) if r.seed == 1]
    assert killed.error == "killed by signal 11 (SIGSEGV)"
    assert read_launches(tmp_path / "runs")[0].finished
    assert sweep.main([spec]) == 1 and sorted(fake_run.executions()) == [0, 1, 1, 2]  # retried, as failed runs are


@pytest.mark.parametrize("kind", ["half a record", *DAMAGED])
def test_an_unreadable_record_is_a_run_to_redo(toy_domain, tmp_path, fake_run, monkeypatch, caplog, kind):
    spec = write_spec(tmp_path, seeds=[0, 1])
    assert sweep.main([spec]) == 0
    (broken,) = [p for p in tmp_path.rglob("record.json") if read_record(p).seed == 1]
    if kind == "half a record":
        broken.write_text("{half a record")
        reason = "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2)"
    else:
        reason = damage(broken, kind, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="runners.sweeps.bookkeeping"):
        assert sweep.main([spec]) == 0  # a FIFO would have hung here, and a huge integer stopped the sweep
    assert [r.getMessage() for r in caplog.records if r.name == "runners.sweeps.bookkeeping"] == [
        f"{broken}: {reason}; the run is made again"]
    assert recorded(tmp_path) == {0: "ok", 1: "ok"} and sorted(fake_run.executions()) == [0, 1, 1]


def test_a_requeued_slurm_task_makes_its_stopped_run_again(toy_domain, tmp_path, fake_run):
    args = one_run(tmp_path)
    cfg = compose(args)
    write_record(run_directory(cfg), fake_record(cfg, "stopped", error="stopped by SIGTERM"))
    assert slurm.SweepJob()(args)["ok"] == 1  # preempted, requeued: the task finds its run stopped, not done
    assert recorded(tmp_path) == {0: "ok"} and fake_run.executions() == [0]


def test_a_sweep_keeps_snapshots_and_tests_each_one(toy_domain, tmp_path):
    """`snapshots: [0.5, 1]`: each run keeps its weights halfway and at the end, and its record's curve holds the
    test metrics of both."""
    path = write_spec(tmp_path, preset="smoke", snapshots=[0.5, 1.0])
    assert sweep.main([path]) == 0
    run_dir = next((tmp_path / "runs").rglob("record.json")).parent
    record = read_record(run_dir)
    steps = [s.step for s in record.snapshots]
    assert [s.fraction for s in record.snapshots] == [0.5, 1.0] and steps[1] == record.timing.steps
    assert all((run_dir / "snapshots" / s.file).is_file() for s in record.snapshots)
    assert [p.step for p in record.curve] == steps and all("test/mse" in p.metrics for p in record.curve)
    assert record.curve[0].metrics["test/mse"] != record.curve[1].metrics["test/mse"]
    with pytest.raises(Exception, match="must be a list of fractions of training in"):
        sweep_spec.load_sweep(write_spec(tmp_path, snapshots=[0, 1]))


def test_a_dry_run_composes_every_run_and_names_a_misspelt_key(toy_domain, tmp_path, capsys):
    path = write_spec(tmp_path, seeds=[0, 1], overrides=[f"cache_dir={tmp_path / 'cache'}", "optim.learning_rate=0.1"])
    assert sweep.main([path, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sweep: 2 of 2 runs invalid: unknown config key 'optim.learning_rate'" in err
    assert "did you mean optim.lr?" in err and not (tmp_path / "runs").exists()
    assert sweep.main([write_spec(tmp_path, seeds=[0]), "--dry-run"]) == 0
