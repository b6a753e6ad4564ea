"""train.step_capture decided by the recipe: which steps are compiled (and captured as CUDA graphs on a card), why the
others stay eager, and when ``auto`` pays the compilation back."""

import torch

from dmlkit.recipe.step_capture_plan import plan_step_capture, worth_capturing

CUDA = torch.device("cuda")
CLEAR = dict(distributed=False, method=False, memory=False, compiled_model=False, miner=False, host_checks=False)


def plan(request="auto", device=CUDA, **changes):
    return plan_step_capture(request, device=device, **{**CLEAR, **changes})


def test_auto_waits_for_the_measured_step_only_where_a_capture_can_pay():
    assert plan().mode == "pending"
    assert plan(planned_steps=100_000).mode == "pending"
    short = plan(planned_steps=40)  # a 40-step run does not pay a minute of compilation
    assert short.mode == "off" and "40 steps at most" in short.reason
    cpu = plan(device=torch.device("cpu"))
    assert cpu.mode == "off" and cpu.describe().startswith("eager: cpu: no CUDA graphs")
    for flag, words in (("miner", "index lists are sized by the data"), ("host_checks", "read on the host every step")):
        decision = plan(**{flag: True})
        assert decision.mode == "off" and words in decision.reason


def test_what_cannot_be_captured_stays_eager_even_when_asked_for():
    assert plan("off").mode == "off"
    for flag, words in (("distributed", "all-gather"), ("method", "hooks"), ("memory", "cross-batch memory"),
                        ("compiled_model", "train.compile")):
        for request in ("auto", "compile"):
            decision = plan(request, **{flag: True})
            assert decision.mode == "off" and words in decision.reason, (flag, request)
    # asked for: the CPU, a miner and host reads only cost speed, so the step is compiled (how the tests run it)
    asked = plan("compile", device=torch.device("cpu"), miner=True, host_checks=True, planned_steps=4)
    assert asked.mode == "compile" and "without graphs" in asked.reason
    both = plan("auto", memory=True, miner=True)
    assert "cross-batch memory" in both.reason and "miner" in both.reason  # every reason is said


def test_auto_weighs_the_steps_left_against_the_compilation():
    yes = worth_capturing(steps_left=20_000, step_seconds=0.01)  # 100 s saved against 45 s
    assert yes.mode == "compile" and "20000 steps left at 10.0 ms" in yes.reason
    no = worth_capturing(steps_left=1_200, step_seconds=0.007)  # the MNIST default on a card: about 4 s saved
    assert no.mode == "off" and "about 4 s against about 45 s" in no.reason
    assert worth_capturing(1_200, 0.007, compile_seconds=1.0).mode == "compile"
