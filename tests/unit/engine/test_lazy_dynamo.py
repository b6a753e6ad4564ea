"""PyTorch's optimisers without torch._dynamo's import (engine/lazy_dynamo.py): the same updates, nothing compiled
meanwhile, PyTorch's own wrappers back once torch._dynamo is loaded or the deferral is restored."""

import subprocess
import sys
import textwrap

CHECK = textwrap.dedent("""
    import sys, torch
    from dmlkit.engine import lazy_dynamo

    def train(make):
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(0)
        model = torch.nn.Linear(6, 3)
        opt = make(model.parameters())
        schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        for _ in range(4):
            opt.zero_grad(set_to_none=True)
            model(torch.randn(5, 6, generator=g)).square().sum().backward()
            opt.step()
            schedule.step()
        state = opt.state_dict()
        opt.load_state_dict(state)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    makers = [lambda p: torch.optim.AdamW(p, lr=0.1, fused=True), lambda p: torch.optim.Adam(p, lr=0.1),
              lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), lambda p: torch.optim.RMSprop(p, lr=0.01)]
    classes = (torch.optim.Adam, torch.optim.SGD, torch.optim.RMSprop)
    originals = {cls: cls.__dict__["step"] for cls in classes}
    assert lazy_dynamo.defer_dynamo_import()
    deferred = [train(make) for make in makers]
    assert "torch._dynamo" not in sys.modules and "sympy" not in sys.modules
    lazy_dynamo.restore()
    for cls in (*classes, torch.optim.AdamW):  # AdamW (Adam's step) hooked the deferring one when it was built
        step = cls.__dict__.get("step", cls.step)
        assert step.__wrapped__.__code__.co_name == "_use_grad", cls  # PyTorch's wrapper, under its profiler hook
    assert "__dynamo_disable" not in torch.optim.Optimizer.zero_grad.__wrapped__.__dict__
    eager = [train(make) for make in makers]  # PyTorch's own path (it imports torch._dynamo)
    assert "torch._dynamo" in sys.modules
    assert all(torch.equal(a, b) for a, b in zip(deferred, eager))
    # deferred again with torch._dynamo loaded: nothing to defer; and a compile after a restore works
    assert not lazy_dynamo.defer_dynamo_import()
    assert torch.equal(torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3)), torch.full((3,), 3.0))
    print("ok")
""")


def test_deferred_optimisers_update_as_pytorchs_and_import_no_dynamo():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_a_step_after_torch_dynamo_loads_is_pytorchs_own():
    code = textwrap.dedent("""
        import sys, torch
        from dmlkit.engine import lazy_dynamo
        lazy_dynamo.defer_dynamo_import()
        p = torch.nn.Parameter(torch.ones(3))
        opt = torch.optim.SGD([p], lr=0.5)
        import torch._dynamo  # something else loaded it: every path is PyTorch's again
        seen = []
        original = torch._dynamo.graph_break
        torch._dynamo.graph_break = lambda: seen.append(1) or original()
        p.grad = torch.ones(3)
        opt.step()
        assert seen and torch.equal(p.detach(), torch.full((3,), 0.5)), (seen, p)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
