"""`quest feed`: data-pipeline and training-step throughput side by side, with their ratio."""
import re

from runners.cli import main as cli
from runners.commands import feed


def test_feed_prints_both_rates_and_their_ratio(toy_domain, run_args, capsys):
    assert cli(["feed", "domain=toy", "--batches", "2", *run_args]) == 0
    line = capsys.readouterr().out
    data, step, ratio = re.search(r"data pipeline ([\d,]+) samples/s .* step on cpu ([\d,]+) samples/s; "
                                  r"data / step = ([\d.]+)", line).groups()
    assert abs(float(data.replace(",", "")) / float(step.replace(",", "")) - float(ratio)) < 0.1 * float(ratio)


def test_the_step_trains_the_model(toy_domain, run_args):
    from common.registry import get_domain
    from runners.config import compose

    cfg = compose(["domain=toy", *run_args])
    datamodule, task = get_domain("toy").build(cfg)
    before = [p.detach().clone() for p in task.parameters()]
    assert feed.step_rate(cfg, datamodule, task, 2, feed.torch.device("cpu")) > 0
    assert any(not b.equal(p) for b, p in zip(before, task.parameters()))
