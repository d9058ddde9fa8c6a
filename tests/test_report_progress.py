"""Progress output of long steps: training reports step, loss and time left, without changing
the weights it trains."""

from __future__ import annotations

import torch

from testbed.models.configs import DRAFT, llama_config
from testbed.models.train import TrainProgress, TrainSpec, train_model


def test_eta_is_the_pace_so_far_times_the_steps_left():
    p = TrainProgress(step=100, steps=2000, loss=1.234, elapsed_s=60.0)
    assert p.eta_s == 60.0 / 100 * 1900
    assert (
        p.line("training target") == "training target: step 100/2000, loss 1.234, 19 min 00 s left"
    )
    assert TrainProgress(5, 10, 2.0, 5.0).line("x").endswith("5 s left")


def test_progress_reports_every_step_up_to_the_last_and_leaves_weights_alone():
    torch.manual_seed(0)
    data = torch.randint(3, 64, (16, 10))
    spec = TrainSpec(steps=4, lr=1e-3, batch_size=4)
    seen: list[TrainProgress] = []
    quiet, _ = train_model(llama_config(DRAFT, 64), data, spec)
    loud, _ = train_model(
        llama_config(DRAFT, 64), data, spec, progress=seen.append, progress_every_s=0
    )
    assert [p.step for p in seen] == [1, 2, 3, 4] and seen[-1].eta_s == 0
    assert all(p.steps == 4 and p.loss > 0 for p in seen)
    for a, b in zip(quiet.state_dict().values(), loud.state_dict().values()):
        assert torch.equal(a, b)
