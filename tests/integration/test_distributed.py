"""Two gloo processes on this machine take the same steps as one process on the same global batch: the helpers
step by step, and the training engine (`Trainer`, what `dmlkit train` runs under torchrun) over a few steps.

The file doubles as the worker script: ``python test_distributed.py --worker OUT`` with
torchrun's environment variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) runs
the steps of every case on one rank and saves the losses and parameters to ``OUT/rank{r}.pt``.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from dmlkit.data.samplers import create_sampler
from dmlkit.engine import distributed as ddp
from dmlkit.engine.objective import TrainingObjective
from dmlkit.exceptions import DataError
from dmlkit.losses.pair import ContrastiveLoss, MultiSimilarityLoss
from dmlkit.losses.proxy import ProxyAnchorLoss
from dmlkit.memory import CrossBatchMemory
from dmlkit.mining import MultiSimilarityMiner

WORLD_SIZE = 2
GLOBAL_BATCH = 16
M_PER_CLASS = 4
NUM_CLASSES = 6
IN_FEATURES, EMBEDDING_SIZE = 12, 8
LR, LOSS_LR = 0.5, 5.0
STEPS = 2
#: ``plain``: dmlkit's recipe; ``no_grad_scale``: gather without the x W compensation;
#: ``scaled_loss``: no compensation in the gather but the loss multiplied by W (the usual recipe).
VARIANTS = ("plain", "no_grad_scale", "scaled_loss")
CASES = ("pair_miner", "proxy_anchor", "xbm")


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed float64 toy data set: features ``[60, 12]``, labels ``[60]`` (10 per class)."""
    g = torch.Generator().manual_seed(123)
    labels = torch.arange(NUM_CLASSES).repeat_interleave(10)
    centres = torch.randn(NUM_CLASSES, IN_FEATURES, generator=g, dtype=torch.float64)
    features = centres[labels] + 0.8 * torch.randn(len(labels), IN_FEATURES, generator=g, dtype=torch.float64)
    return features, labels


def make_model() -> nn.Module:
    """A small float64 MLP (no BatchNorm: CPU DDP cannot sync batch statistics), seeded explicitly."""
    model = nn.Sequential(nn.Linear(IN_FEATURES, 16), nn.Tanh(), nn.Linear(16, EMBEDDING_SIZE)).double()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.4 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return model


def make_objective(case: str) -> TrainingObjective:
    if case == "pair_miner":
        return TrainingObjective(MultiSimilarityLoss(), MultiSimilarityMiner(epsilon=0.1))
    if case == "proxy_anchor":
        return TrainingObjective(ProxyAnchorLoss(NUM_CLASSES, EMBEDDING_SIZE, margin=0.1, alpha=32, seed=3)).double()
    if case == "xbm":
        loss = ContrastiveLoss(pos_margin=0.0, neg_margin=1.0)
        return TrainingObjective(loss, memory=CrossBatchMemory(loss, EMBEDDING_SIZE, memory_size=24)).double()
    raise ValueError(case)


def run_steps(case: str, variant: str, rank: int, world_size: int) -> dict:
    """``STEPS`` SGD steps on this rank's part of each global batch; returns losses and final parameters."""
    features, labels = dataset()
    sampler = create_sampler("m_per_class", labels=labels, m=M_PER_CLASS, batch_size=GLOBAL_BATCH,
                             length_before_new_iter=len(labels), seed=5, rank=rank, world_size=world_size)
    batches = sampler.batches(0)
    model = make_model()
    objective = make_objective(case)
    forward = ddp.wrap_model(model)
    groups = [{"params": list(model.parameters()), "lr": LR}]
    loss_params = [p for p in objective.parameters() if p.requires_grad]
    if loss_params:
        groups.append({"params": loss_params, "lr": LOSS_LR})
    optimizer = torch.optim.SGD(groups, lr=LR)
    world = ddp.dist_info().world_size
    losses = []
    for step in range(STEPS):
        idx = batches[step]
        local = forward(features[idx])
        grad_scale = None if variant == "plain" else 1.0
        embeddings = ddp.all_gather_with_grad(local, grad_scale=grad_scale, check_shapes=True)
        batch_labels = ddp.all_gather_labels(labels[idx])
        loss = objective(embeddings, batch_labels)
        optimizer.zero_grad(set_to_none=True)
        (loss * world if variant == "scaled_loss" else loss).backward()
        ddp.allreduce_gradients_(loss_params)
        optimizer.step()
        losses.append(float(loss.detach()))
    return {
        "losses": losses,
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "objective": {k: v.detach().clone() for k, v in objective.state_dict().items()},
        "global_rows": ddp.all_gather_labels(batches[:STEPS].reshape(-1).contiguous()),
    }


def partial_gradients(rank: int) -> list:
    """allreduce_gradients_ when only rank 0 has a gradient for ``a`` and no rank has one for ``b``."""
    a, b = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2))
    if rank == 0:
        a.grad = torch.tensor([2.0, 4.0])
    ddp.allreduce_gradients_([a, b])
    return [a.grad, b.grad]


def worker_main(out: Path) -> None:
    torch.set_num_threads(1)
    info = ddp.init_distributed()
    assert info.world_size == WORLD_SIZE and info.backend == "gloo", info
    results = {
        f"{case}/{variant}": run_steps(case, variant, info.rank, info.world_size)
        for case in CASES
        for variant in VARIANTS
    }
    results["info"] = (info.rank, info.world_size, info.local_rank, info.is_main, ddp.is_main_process())
    results["broadcast"] = ddp.broadcast_object({"from": info.rank})
    results["partial_grads"] = partial_gradients(info.rank)
    try:
        ddp.all_gather_with_grad(torch.zeros(3 + info.rank, 2), check_shapes=True)
        results["shape_error"] = ""
    except DataError as err:
        results["shape_error"] = str(err)
    ddp.barrier()
    torch.save(results, out / f"rank{info.rank}.pt")
    ddp.cleanup_distributed()


# ----------------------------------------------------------------------------- the test


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def forked_rank(rank: int, port: int, out: str) -> None:
    """One rank in a forked child (torch is already imported there): torchrun's env vars, then the worker."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD_SIZE),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    worker_main(Path(out))


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory, single_results) -> list[dict]:
    """Start 2 ranks the way torchrun would (env vars, gloo on 127.0.0.1) and load their outputs.

    The ranks are forked from this process so they skip re-importing torch (a fresh interpreter
    costs seconds each on a busy 2-core machine); ``python test_distributed.py --worker OUT``
    under torchrun runs the same worker in fresh processes. Depending on ``single_results``
    makes the parent pay torch's lazy imports (the optimiser pulls in torch._dynamo) once, before the fork.
    """
    out = tmp_path_factory.mktemp("ddp")
    fork_ranks(forked_rank, out)
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD_SIZE)]


def fork_ranks(target, out: Path, timeout: float = 180) -> None:
    """``target(rank, port, out)`` in :data:`WORLD_SIZE` forked processes; every rank must exit 0."""
    port = free_port()
    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=target, args=(rank, port, str(out))) for rank in range(WORLD_SIZE)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=timeout)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for rank, proc in enumerate(procs):
        assert proc.exitcode == 0, f"rank {rank} exited with {proc.exitcode}"


@pytest.fixture(scope="module")
def single_results() -> dict:
    """The reference: one process, whole global batches (1 thread like each rank; restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {case: run_steps(case, "plain", rank=0, world_size=1) for case in CASES}
    finally:
        torch.set_num_threads(threads)


def assert_same_state(got: dict, want: dict, atol: float) -> None:
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=atol, rtol=0, msg=lambda m, k=key: f"{k}: {m}")


def max_difference(got: dict, want: dict) -> float:
    return max(float((got[k] - want[k]).abs().max()) for k in want)


@pytest.mark.parametrize("case", CASES)
def test_two_ranks_match_one_process(case, two_rank_results, single_results):
    want = single_results[case]
    for rank, results in enumerate(two_rank_results):
        got = results[f"{case}/plain"]
        # The ranks' parts, in rank order, are exactly the single process's global batches.
        assert torch.equal(got["global_rows"].view(WORLD_SIZE, STEPS, -1).transpose(0, 1).reshape(-1),
                           want["global_rows"]), rank
        assert got["losses"] == pytest.approx(want["losses"], abs=1e-10), rank
        assert_same_state(got["model"], want["model"], atol=1e-10)
        assert_same_state(got["objective"], want["objective"], atol=1e-10)


@pytest.mark.parametrize("case", CASES)
def test_ranks_hold_identical_parameters(case, two_rank_results):
    first, second = (r[f"{case}/plain"] for r in two_rank_results)
    assert first["losses"] == second["losses"]
    for part in ("model", "objective"):
        for key in first[part]:
            assert torch.equal(first[part][key], second[part][key]), (part, key)


def test_without_gradient_compensation_the_model_update_differs(two_rank_results, single_results):
    """The x W in the gather's backward matters: without it DDP's mean halves the model's step."""
    for case in CASES:
        got = two_rank_results[0][f"{case}/no_grad_scale"]
        assert got["losses"][0] == pytest.approx(single_results[case]["losses"][0], abs=1e-10)
        assert max_difference(got["model"], single_results[case]["model"]) > 1e-4, case


def test_scaling_the_loss_instead_overscales_the_proxies(two_rank_results, single_results):
    """loss * W also compensates DDP's mean for the model, but multiplies the proxies' gradient by W."""
    pair = two_rank_results[0]["pair_miner/scaled_loss"]
    assert_same_state(pair["model"], single_results["pair_miner"]["model"], atol=1e-10)
    proxy = two_rank_results[0]["proxy_anchor/scaled_loss"]
    assert max_difference(proxy["objective"], single_results["proxy_anchor"]["objective"]) > 1e-3


def test_collective_helpers_under_two_ranks(two_rank_results):
    for rank, results in enumerate(two_rank_results):
        assert tuple(results["info"]) == (rank, WORLD_SIZE, rank, rank == 0, rank == 0)
        assert results["broadcast"] == {"from": 0}
        averaged, never = results["partial_grads"]
        assert torch.equal(averaged, torch.tensor([1.0, 2.0])) and never is None
        assert results["shape_error"] == (
            "embeddings must have the same shape on every rank to be gathered. Got rank 0: [3, 2], rank 1: [4, 2]."
        )


# ----------------------------------------------------------------------------- single process


@pytest.fixture
def no_torchrun_env(monkeypatch):
    for name in ddp.TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)


def test_single_process_is_a_no_op(no_torchrun_env):
    info = ddp.init_distributed()
    assert info == ddp.DistInfo(rank=0, world_size=1, local_rank=0, is_main=True, backend=None)
    assert not info.enabled and ddp.is_main_process()
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
    assert ddp.all_gather_with_grad(x) is x
    labels = torch.tensor([1, 2, 3, 4])
    assert ddp.all_gather_labels(labels) is labels
    p = nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    ddp.allreduce_gradients_([p])
    assert torch.equal(p.grad, torch.full((3,), 2.0))
    model = nn.Linear(3, 2)
    assert ddp.wrap_model(model, info) is model
    assert ddp.broadcast_object({"a": 1}) == {"a": 1}
    ddp.barrier()


def test_world_size_one_env_does_not_initialise(no_torchrun_env, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert ddp.init_distributed() == ddp.DistInfo()
    assert not torch.distributed.is_initialized()


def test_bad_rank_env_is_reported(no_torchrun_env, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "5")
    with pytest.raises(ValueError, match="RANK is 5 but WORLD_SIZE is 2"):
        ddp.init_distributed()
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK must be an int. Got 'zero'"):
        ddp.init_distributed()
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match="The 'backend' parameter of init_distributed must be one of"):
        ddp.init_distributed(backend="mpi")
    assert not torch.distributed.is_initialized()


def test_unwrap_model_finds_the_inner_module():
    inner = nn.Linear(2, 2)
    wrapper = nn.Module()
    wrapper.module = inner
    assert ddp.unwrap_model(wrapper) is inner
    empty = nn.Sequential()
    assert ddp.unwrap_model(empty) is empty


# ---------------------------------------------------------------- the training engine under two ranks

#: The MNIST default shrunk: 4 steps of global batch 32, no augmentation (a rank draws its part's shifts from the
#: batch's generator: other numbers than one process drawing the whole batch's), BatchNorm frozen (gloo has no
#: SyncBatchNorm), no validation, 1 thread a process.
TRAINER_OVERRIDES = [
    "train.max_steps=4", "train.log_every=1", "train.progress=false", "train.checkpoint_every=1000",
    "eval.clustering=false", "eval.save_embeddings=false", "model.args={width: 8}", "model.freeze_bn=true",
    "sampler.batch_size=32", "sampler.m=8", "train.mixed_precision=none", "model.shift_average=0",
    "data.augment=none", "protocol.val_class_fraction=0", "train.num_threads=1", "train.device=cpu",
]


def train_with_engine(run_dir: Path) -> dict:
    """``Trainer.fit`` of :data:`TRAINER_OVERRIDES` (the test split's evaluation left out): each step's loss, the
    weights and proxies at the end, and the rank's share of each batch."""
    from dmlkit.config import load_config
    from dmlkit.engine.callbacks import Callback
    from dmlkit.recipe import Trainer

    class Losses(Callback):
        def __init__(self):
            self.values = []

        def on_step_end(self, trainer, step, metrics):
            self.values.append(float(metrics["loss"]))

    losses = Losses()
    trainer = Trainer(load_config(preset="mnist-proxy-anchor", overrides=TRAINER_OVERRIDES), run_dir,
                      callbacks=[losses], echo=lambda _: None)
    trainer.finish = lambda has_val: None
    trainer.fit()
    state = {f"model.{k}": v.detach().clone() for k, v in trainer.model.state_dict().items()}
    state.update({f"objective.{k}": v.detach().clone() for k, v in trainer.objective.state_dict().items()})
    return {"losses": torch.tensor(losses.values, dtype=torch.float64), "state": state,
            "capture": trainer.step_capture.mode, "steps": trainer.step}


def forked_engine_rank(rank: int, port: int, out: str) -> None:
    """One rank of the engine test in a forked child, with torchrun's environment variables."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD_SIZE),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    torch.save(train_with_engine(Path(out) / "run"), Path(out) / f"engine{rank}.pt")
    ddp.cleanup_distributed()


@pytest.mark.slow
def test_the_trainer_under_two_ranks_follows_one_process_with_the_global_batch(tmp_path):
    """``dmlkit train``'s engine (not only its helpers): 2 gloo ranks with 16 images each take the steps one process
    takes with the 32-image global batch: the same losses, weights and Proxy-Anchor proxies, within float error."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = train_with_engine(tmp_path / "single")
    finally:
        torch.set_num_threads(threads)
    fork_ranks(forked_engine_rank, tmp_path)
    ranks = [torch.load(tmp_path / f"engine{r}.pt", weights_only=True) for r in range(WORLD_SIZE)]
    assert single["steps"] == 4 and len(single["losses"]) == 4
    for got in ranks:
        assert got["steps"] == 4 and got["capture"] == "off"  # several processes: eager steps
        torch.testing.assert_close(got["losses"], single["losses"], rtol=1e-5, atol=1e-6)
        assert_same_state(got["state"], single["state"], atol=1e-5)
    assert_same_state(ranks[1]["state"], ranks[0]["state"], atol=0)  # the ranks never drift apart


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--worker":
    worker_main(Path(sys.argv[2]))
