"""Optimiser parameter groups, warm-up and schedules."""

import math

import pytest
import torch
from torch import nn

from dmlkit.config.schema import OptimizerConfig
from dmlkit.engine.optim import build_optimizer, build_scheduler, schedule_factor


class TwoPart(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(3, 3)
        self.head = nn.Linear(3, 2)

    def trunk_parameters(self):
        return self.trunk.parameters()

    def head_parameters(self):
        return self.head.parameters()


class WithProxies(nn.Module):
    def __init__(self):
        super().__init__()
        self.proxies = nn.Parameter(torch.zeros(4, 2))


def test_groups_and_proxy_multiplier():
    cfg = OptimizerConfig(name="adam", lr=1e-3, loss_lr_multiplier=100)
    opt = build_optimizer(TwoPart(), WithProxies(), cfg)
    lrs = {g["name"]: g["lr"] for g in opt.param_groups}
    assert lrs == {"trunk": 1e-3, "head": 1e-3, "loss": 1e-1}


def test_warmup_freezes_trunk_only():
    cfg = OptimizerConfig(name="sgd", lr=0.1, warmup_steps=2, loss_lr_multiplier=1)
    model, loss = TwoPart(), WithProxies()
    opt = build_optimizer(model, loss, cfg)
    sched = build_scheduler(opt, cfg, max_steps=10)
    lrs = {g["name"]: g["lr"] for g in opt.param_groups}
    assert lrs["trunk"] == 0.0 and lrs["head"] == 0.1
    for _ in range(2):
        opt.step()
        sched.step()
    assert {g["name"]: g["lr"] for g in opt.param_groups}["trunk"] == 0.1


def test_schedules():
    step = OptimizerConfig(scheduler="step", step_size=10, gamma=0.5)
    assert schedule_factor(step, 25, 100) == 0.25
    cos = OptimizerConfig(scheduler="cosine")
    assert math.isclose(schedule_factor(cos, 50, 100), 0.5)
    assert schedule_factor(cos, 100, 100) < 1e-12


def test_warmup_stable_decay_holds_the_rate_then_decays_over_the_last_fraction():
    wsd = OptimizerConfig(scheduler="wsd", decay_fraction=0.25)
    assert [schedule_factor(wsd, s, 200) for s in (0, 100, 150)] == [1.0, 1.0, 1.0]
    for step in (160, 175, 190, 200, 230):  # float64 reference: 0.5 (1 + cos(pi t)), t the decay's elapsed part
        t = min((step - 150) / 50, 1.0)
        assert math.isclose(schedule_factor(wsd, step, 200), 0.5 * (1 + math.cos(math.pi * t)), abs_tol=1e-15)
    assert schedule_factor(wsd, 175, 200) == pytest.approx(0.5)
    # a horizon cut to 60 % (a loaded machine) keeps the full rate over 80 % of its steps
    assert schedule_factor(OptimizerConfig(scheduler="wsd"), 47, 60) == 1.0
    one = OptimizerConfig(scheduler="wsd", decay_fraction=1.0)  # the whole horizon: the cosine itself
    assert all(math.isclose(schedule_factor(one, s, 80), schedule_factor(OptimizerConfig(scheduler="cosine"), s, 80))
               for s in range(81))


def test_an_unset_schedule_names_the_field():
    with pytest.raises(ValueError, match="optimizer.scheduler is unset"):
        schedule_factor(OptimizerConfig(scheduler=None), 1, 10)


def test_adam_takes_the_fused_kernels_where_every_parameter_is_on_the_cpu_or_a_gpu(monkeypatch):
    import dmlkit.engine.optim as optim

    for name in ("adam", "adamw"):
        monkeypatch.undo()
        cfg = OptimizerConfig(name=name, lr=1e-2, weight_decay=1e-3, loss_lr_multiplier=1)
        assert build_optimizer(TwoPart(), WithProxies(), cfg).defaults.get("fused")  # CPU parameters
        results = []
        for fused in (False, True):  # the fused step moves the weights as the foreach one does
            monkeypatch.setattr(optim, "fused_capable", lambda groups, fused=fused: fused)
            torch.manual_seed(0)
            model, loss = TwoPart(), WithProxies()
            opt = build_optimizer(model, loss, cfg)
            assert bool(opt.defaults.get("fused")) is fused
            for _ in range(3):
                opt.zero_grad()
                (model.head(model.trunk(torch.ones(2, 3))).square().sum() + loss.proxies.sum()).backward()
                opt.step()
            results.append(torch.cat([p.detach().flatten() for p in (*model.parameters(), *loss.parameters())]))
        torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=1e-7)
        assert not torch.equal(results[0], torch.zeros_like(results[0]))
    monkeypatch.undo()
    assert optim.fused_capable([{"params": [nn.Parameter(torch.zeros(2))]}])
    # no fused kernels on the meta device, for integer tensors, or across device types
    assert not optim.fused_capable([{"params": [nn.Parameter(torch.zeros(2, device="meta"))]}])
    assert not optim.fused_capable([{"params": [nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False)]}])
    assert not optim.fused_capable([{"params": [nn.Parameter(torch.zeros(2)),
                                                 nn.Parameter(torch.zeros(2, device="meta"))]}])
    assert not optim.fused_capable([{"params": []}])
