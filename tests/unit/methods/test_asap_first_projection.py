"""ASAP Alg. 1, line 2: rho* starts as random samples, and the first projection's k-center runs around them."""

from __future__ import annotations

import torch

from dmlkit.config import load_config
from dmlkit.evaluation.embed import embed_dataset
from dmlkit.recipe import Trainer

ASAP = ["asap.enabled=true", "asap.proxies_per_class=2", "asap.pool_size=5", "protocol.val_fraction=0.2",
        "train.progress=false", "eval.clustering=false", "sampler.batch_size=32", "sampler.m=8",
        "model.embedding_size=8", "train.max_steps=8"]


def greedy_k_center_alg2(pool: list[list[float]], rho: list[list[float]], k: int) -> list[int]:
    """Alg. 2 for one class, float64 lists: q = argmax_{u in p minus r} min_{v in rho u r} ||u - v||, k times."""
    chosen: list[int] = []
    for _ in range(k):
        centres = rho + [pool[i] for i in chosen]
        far = [(min(sum((a - b) ** 2 for a, b in zip(u, v)) for v in centres), -i)
               for i, u in enumerate(pool) if i not in chosen]
        chosen.append(-max(far)[1])
    return chosen


def test_the_first_projection_covers_around_the_initial_random_samples(tmp_path):
    trainer = Trainer(load_config(overrides=ASAP), tmp_path, echo=lambda _: None)
    hooks = trainer.hooks
    hooks.initialize_from_random_samples(trainer)
    rho_star = hooks.bank.per_class().detach().clone()
    emb, raw = embed_dataset(trainer.model, trainer.splits.train)
    labels = trainer.label_map(raw)
    for c in range(rho_star.shape[0]):  # rho*: embeddings of K distinct training samples of each class
        d = torch.cdist(rho_star[c].double(), emb.double())
        rows = d.argmin(1)
        assert torch.all(d.min(1).values < 1e-3) and rows.unique().numel() == 2 and torch.all(labels[rows] == c)
    state = hooks.generator.get_state()
    pool, mask = hooks.pool_embeddings(trainer)  # the pool the projection will draw
    hooks.generator.set_state(state)
    hooks.start_projection(trainer)
    proxies = hooks.bank.per_class().detach()
    for c in range(proxies.shape[0]):
        members = [[float(v) for v in pool[c, i]] for i in range(pool.shape[1]) if mask[c, i]]
        picks = greedy_k_center_alg2(members, [[float(v) for v in r] for r in rho_star[c]], 2)
        expected = torch.tensor([members[i] for i in picks], dtype=torch.float64)
        torch.testing.assert_close(proxies[c].double(), expected, atol=1e-6, rtol=0)
