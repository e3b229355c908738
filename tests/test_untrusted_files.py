"""Files and text a user could have been handed are data, never code: a crafted checkpoint or cache that
would create a file if unpickled is refused (checkpoint: one line, exit 2; cache: rebuilt), and no value
from the command line or a sweep file reads the environment."""
import errno
import logging
import os

import pytest
import torch
from conftest import CreatesAFile, make_record

from common.data import cached, load_mnist
from common.records import write_record
from runners.cli import main as cli
from runners.config import as_yaml, compose


def finished_run(tmp_path, *args):
    """A run directory as ``quest train`` leaves it, with its real config, for a checkpoint to be put in."""
    cfg = compose([*args, f"output_dir={tmp_path / 'runs'}", f"cache_dir={tmp_path / 'cache'}", "threads=1"])
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(as_yaml(cfg))
    write_record(run_dir, make_record(cfg.attention.variant, 0, {}, domain=cfg.domain))
    return run_dir


COMMANDS = {  # commands that restore a finished run, and the run each takes (quest imagenet: tests/test_imagenet.py)
    "robustness": ["domain=vision", "preset=smoke"],
    "generate": ["domain=language", "preset=smoke"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_checkpoint_that_would_run_code_is_refused(tmp_path, capsys, command):
    run_dir = finished_run(tmp_path, *COMMANDS[command])
    marker = tmp_path / "ran-code"
    torch.save({"state_dict": {}, "payload": CreatesAFile(marker)}, run_dir / "checkpoints" / "best.ckpt")
    assert cli([command, str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert not marker.exists()
    assert f"{run_dir}/checkpoints/best.ckpt holds objects other than tensors" in err and err.count("\n") == 1, err


class RunsACommand:
    """Unpickled, this would call ``os.getpid`` (``posix.getpid``, a module torch names as blocked)."""

    def __reduce__(self):
        return os.getpid, ()


def test_a_checkpoint_naming_a_blocked_module_is_refused_as_code(tmp_path, capsys):
    run_dir = finished_run(tmp_path, *COMMANDS["robustness"])
    torch.save({"state_dict": {}, "payload": RunsACommand()}, run_dir / "checkpoints" / "best.ckpt")
    assert cli(["robustness", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "holds objects other than tensors and plain containers (posix.getpid)" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("content, problem", [
    (b"", "is not a readable Lightning checkpoint"),
    (b"PK\x03\x04 half a zip", "is not a readable Lightning checkpoint"),
])
def test_a_truncated_or_garbage_checkpoint_is_named_in_one_line(tmp_path, capsys, content, problem):
    run_dir = finished_run(tmp_path, *COMMANDS["robustness"])
    (run_dir / "checkpoints" / "best.ckpt").write_bytes(content)
    assert cli(["robustness", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert f"{run_dir}/checkpoints/best.ckpt {problem}" in err and err.count("\n") == 1, err


def test_a_checkpoint_of_another_model_is_named_in_one_line(tmp_path, capsys):
    run_dir = finished_run(tmp_path, *COMMANDS["robustness"])
    torch.save({"state_dict": {"net.weight": torch.ones(2)}}, run_dir / "checkpoints" / "best.ckpt")
    assert cli(["robustness", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "best.ckpt does not hold this run's model" in err and err.count("\n") == 1, err


def trained_weights(run_dir):
    """A checkpoint of the run's own (untrained) model, so that a command restoring the run would get through."""
    from common.files import read_yaml
    from common.registry import get_domain, read_config

    cfg = read_config(read_yaml(run_dir / "config.yaml", "run config", 2**20), "run config")
    _, task = get_domain(cfg.domain).build(cfg)
    torch.save({"state_dict": task.state_dict()}, run_dir / "checkpoints" / "best.ckpt")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_run_config_that_would_read_the_environment_is_refused_and_exposes_nothing(tmp_path, capsys, monkeypatch,
                                                                                  command):
    run_dir = finished_run(tmp_path, *COMMANDS[command])
    trained_weights(run_dir)
    (run_dir / "config.yaml").write_text((run_dir / "config.yaml").read_text() + "version: ${oc.env:SOME_TOKEN}\n")
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    monkeypatch.setenv("SOME_TOKEN", "hunter2-secret")
    assert cli([command, str(run_dir)]) == 2
    out, err = capsys.readouterr()
    assert f"{run_dir}/config.yaml is not a run config: config.version holds an interpolation" in err, err
    assert err.count("\n") == 1 and "hunter2" not in out + err
    after = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    assert after == before  # nothing written: the record holds no token, and no file was added


@pytest.mark.parametrize("text", ["domain: [unclosed", "- a list\n- not a config\n", "seed: 0\n"])
def test_a_malformed_run_config_is_named_in_one_line(tmp_path, capsys, text):
    run_dir = finished_run(tmp_path, *COMMANDS["robustness"])
    torch.save({"state_dict": {}}, run_dir / "checkpoints" / "best.ckpt")
    (run_dir / "config.yaml").write_text(text)
    for command in COMMANDS:
        assert cli([command, str(run_dir)]) == 2
        err = capsys.readouterr().err
        assert f"{run_dir}/config.yaml is not a" in err and err.count("\n") == 1, err


def test_a_cache_that_would_run_code_is_rebuilt_not_trusted(tmp_path, caplog):
    marker = tmp_path / "ran-code"
    path = tmp_path / "cache" / "mnist5k.pt"
    path.parent.mkdir()
    torch.save({"key": path.name, "value": CreatesAFile(marker)}, path)
    with caplog.at_level(logging.WARNING, logger="common.data"):
        digits = load_mnist(tmp_path / "cache")
    assert not marker.exists()
    assert digits["images"].shape == (5000, 1, 28, 28)
    assert f"rebuilding the cache {path} (unreadable: UnpicklingError)" in caplog.text
    assert torch.load(path, weights_only=True)["value"]["labels"].equal(digits["labels"])  # rebuilt in place


def test_a_cache_is_read_back_only_under_its_own_key(tmp_path, caplog):
    path = tmp_path / "a.pt"
    assert cached(path, lambda: {"x": torch.arange(3)})["x"].tolist() == [0, 1, 2]
    assert cached(path, lambda: pytest.fail("a good cache is read, not rebuilt"))["x"].tolist() == [0, 1, 2]
    (tmp_path / "b.pt").write_bytes(path.read_bytes())  # another file's content under this name
    with caplog.at_level(logging.WARNING, logger="common.data"):
        assert cached(tmp_path / "b.pt", lambda: "rebuilt") == "rebuilt"
    assert "made for another key" in caplog.text


def test_a_cache_dir_that_cannot_be_written_is_named(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    args = ["train", "domain=vision", "preset=smoke", f"output_dir={tmp_path / 'runs'}", "trainer.enable_progress_bar=false"]
    assert cli([*args, f"cache_dir={blocker}"]) == 2
    err = capsys.readouterr().err
    assert f"cannot write the cache file {blocker}/mnist5k.pt" in err and "cache_dir=" in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()

    def denied(*args, **kwargs):  # a read-only folder (the tests run as root, for whom chmod does not bite)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("tempfile.mkstemp", denied)
    assert cli([*args, f"cache_dir={tmp_path / 'read-only'}"]) == 2
    err = capsys.readouterr().err
    assert f"cannot write the cache file {tmp_path}/read-only/mnist5k.pt (Permission denied)" in err, err


def test_a_full_disk_while_writing_the_cache_is_one_line_and_leaves_no_temp_file(tmp_path, capsys, monkeypatch):
    def full(obj, file, *args, **kwargs):
        file.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    args = ["train", "domain=vision", "preset=smoke", f"output_dir={tmp_path / 'runs'}",
            f"cache_dir={tmp_path / 'cache'}", "trainer.enable_progress_bar=false"]
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert f"cannot write the cache file {tmp_path}/cache/mnist5k.pt (No space left on device)" in err, err
    assert err.count("\n") == 1 and list((tmp_path / "cache").iterdir()) == [] and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("override", ["cache_dir=/x/${oc.env:SECRET_TOKEN}", "optim.name=${oc.env:SECRET_TOKEN}",
                                      "data.split=[0.8,0.1,'${oc.env:SECRET_TOKEN}']", "optim.name=${nope}"])
def test_command_line_values_never_read_the_environment(toy_domain, run_args, tmp_path, capsys, monkeypatch,
                                                         override):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    assert cli(["train", "domain=toy", override, *run_args]) == 2
    err = capsys.readouterr().err
    assert "holds an interpolation" in err and "hunter2" not in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


def test_sweep_file_values_never_read_the_environment(toy_domain, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    spec = tmp_path / "leak.yaml"
    spec.write_text(f"domains: [toy]\nseeds: [0]\noutput_dir: {tmp_path}/runs\n"
                    "overrides: ['cache_dir=${oc.env:SECRET_TOKEN}']\n")
    assert cli(["sweep", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}: overrides" in err and "hunter2" not in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()
