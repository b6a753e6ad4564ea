"""ASAP: alternating sets of alternating proxies, as hooks on the training engine.

Algorithm 1 of the ASAP paper, on top of any proxy loss (``ProxyPairLoss`` around C1/C2/MS/
triplet, Proxy-Anchor, Proxy-NCA):

* before the first projection, rho* is the embeddings of ``K`` random samples per class (Alg. 1,
  line 2);
* at the start of each projection, the ``K`` proxies of every class are re-initialised by
  greedy k-center (Alg. 2) on a pool of ``b`` fresh embeddings per class around rho* (the initial
  samples, then the class's converged proxies), and the optimiser state of the proxies is reset;
* during the projection the trunk and head get the proximal gradient ``lambda (theta - theta*)``
  of Eq. (4.11), independent of the optimiser's weight decay;
* a projection ends when validation MAP@R has not improved for ``patience`` evaluations;
  then ``theta* <- theta, rho* <- rho`` of the projection's best validation (Alg. 1: the model's
  weights and the proxies are both restored) and the next projection starts from them;
* training stops after ``projections_without_improvement`` projections that did not improve
  the best MAP@R, after ``max_projections``, or at the step budget.
"""

from __future__ import annotations

import copy
import math

import torch

from dmlkit.core.seeds import derive_generator
from dmlkit.data.splits import shuffle_within_classes
from dmlkit.exceptions import ConfigError
from dmlkit.methods.hooks import MethodHooks, TrainingState
from dmlkit.methods.registry import METHODS
from dmlkit.proxies.kcenter import average_covering_radius, refresh_proxies_k_center


def proximal_gradient_(params: list[torch.nn.Parameter], anchors: list[torch.Tensor], lam: float) -> None:
    """Add ``lam * (theta - theta*)`` to each parameter's gradient (the gradient of Eq. 4.11's ``lam/2 ||theta - theta*||^2``)."""
    if lam == 0:
        return
    for p, a in zip(params, anchors):
        if p.grad is None:
            p.grad = lam * (p.detach() - a)
        else:
            p.grad.add_(p.detach() - a, alpha=lam)


def proxy_spread(per_class: torch.Tensor) -> float:
    """Mean pairwise Euclidean distance between the ``K`` proxies of a class, averaged over classes."""
    c, k, _ = per_class.shape
    if k < 2:
        return 0.0
    d = torch.cdist(per_class.float(), per_class.float())
    return float(d.sum() / (c * k * (k - 1)))


@METHODS.register("asap")
class AsapHooks(MethodHooks):
    """ASAP's outer loop (Alg. 1) driven by the engine's evaluation calls."""

    @classmethod
    def enabled(cls, cfg) -> bool:
        return bool(cfg.asap.enabled)

    @classmethod
    def loss_arguments(cls, cfg) -> dict:
        return {"proxies_per_class": cfg.asap.proxies_per_class}  # K proxies per class (Eq. 4.11)

    def __init__(self, trainer: TrainingState):
        cfg = trainer.cfg.asap
        self.cfg = cfg
        loss = trainer.objective.loss
        if getattr(loss, "bank", None) is None:
            raise ConfigError(
                f"asap.enabled needs a proxy loss (proxy_pair, proxy_anchor, proxy_nca, ...). Got loss {trainer.cfg.loss.name!r}."
            )
        if trainer.splits.val is None:
            raise ConfigError("asap.enabled needs a validation split: set protocol.fold, protocol.val_fraction or "
                              "protocol.val_class_fraction > 0 (or give dmlkit.fit a val_data).")
        self.bank = loss.bank
        if self.bank.is_fractional or int(self.bank.proxies_per_class) != cfg.proxies_per_class:
            raise ConfigError(
                f"asap.proxies_per_class ({cfg.proxies_per_class}) must equal the loss's proxies_per_class "
                f"({self.bank.proxies_per_class})."
            )
        self.projection = 0
        self.started = False
        self.projection_best = -math.inf
        self.projection_evals_since_best = 0
        self.projection_start_step = 0
        self.projections_without_improvement = 0
        self.best_at_projection_start = -math.inf
        self.radius_before = float("nan")
        self.generator = derive_generator(trainer.cfg.seed, "asap_pools")
        self.anchors: list[torch.Tensor] = []
        self.projection_best_state: dict | None = None
        self.projection_best_proxies: torch.Tensor | None = None
        n = len(trainer.splits.train)
        d = trainer.cfg.model.embedding_size
        # anchors and the cache live with the model (no host copy per step); pools and k-center run on the CPU
        self.device = trainer.device
        self.cache = torch.zeros(n, d, device=self.device) if cfg.pool_source == "cache" else None
        self.cache_filled = torch.zeros(n, dtype=torch.bool, device=self.device) if cfg.pool_source == "cache" else None

    # ------------------------------------------------------------------ engine hooks

    def _params(self, trainer: TrainingState) -> list[torch.nn.Parameter]:
        return [p for p in trainer.model.parameters() if p.requires_grad]

    def on_train_start(self, trainer: TrainingState) -> None:
        if not self.started:
            self.start_projection(trainer)
        elif not self.anchors:  # resumed: anchors come from state_dict
            raise RuntimeError("ASAP state restored without its anchor parameters")

    def on_batch_embeddings(self, trainer: TrainingState, indices: list[int], embeddings: torch.Tensor) -> None:
        if self.cache is not None:
            idx = torch.as_tensor(indices, dtype=torch.int64, device=self.device)
            self.cache[idx] = embeddings.detach().float()
            self.cache_filled[idx] = True

    def after_backward(self, trainer: TrainingState) -> None:
        proximal_gradient_(self._params(trainer), self.anchors, self.cfg.proximal_lambda)

    def on_evaluation(self, trainer: TrainingState, score: float, improved: bool) -> bool:
        if score > self.projection_best:
            self.projection_best = score
            self.projection_evals_since_best = 0
            self.projection_best_state = copy.deepcopy(trainer.model.state_dict())
            self.projection_best_proxies = self.bank.proxies.detach().clone()
        else:
            self.projection_evals_since_best += 1
        if self.projection_evals_since_best < self.cfg.patience:
            return False
        return self.end_projection(trainer)

    def on_train_end(self, trainer: TrainingState) -> None:
        """Log the projection the step budget interrupted (``complete: false``)."""
        if self.projection_start_step < trainer.step and self.projection_best > -math.inf:
            self.log_projection(trainer, complete=False)

    # ------------------------------------------------------------------ projections

    def log_projection(self, trainer: TrainingState, complete: bool) -> None:
        """One ``kind: projection`` record: steps, best MAP@R, covering radius before/after, proxy spread."""
        trainer.run_dir.log(
            {
                "kind": "projection",
                "projection": self.projection,
                "complete": complete,
                "step": trainer.step,
                "steps": trainer.step - self.projection_start_step,
                "best_map_at_r": self.projection_best,
                "covering_radius_before": self.radius_before,
                "covering_radius_after": self.training_covering_radius(trainer),
                "proxy_spread": proxy_spread(self.bank.per_class().detach()),
                "time": trainer.elapsed,
            }
        )

    def end_projection(self, trainer: TrainingState) -> bool:
        """theta* <- theta, rho* <- rho at this projection's best validation; log it; decide whether to start another."""
        if self.projection_best_state is not None:
            trainer.model.load_state_dict(self.projection_best_state)
        if self.projection_best_proxies is not None:
            with torch.no_grad():
                self.bank.proxies.copy_(self.projection_best_proxies)
        improved = self.projection_best > self.best_at_projection_start
        self.projections_without_improvement = 0 if improved else self.projections_without_improvement + 1
        self.log_projection(trainer, complete=True)
        self.projection += 1
        if self.projection >= self.cfg.max_projections:
            return True
        if self.projections_without_improvement >= self.cfg.projections_without_improvement:
            return True
        self.start_projection(trainer)
        return False

    def start_projection(self, trainer: TrainingState) -> None:
        """Re-initialise proxies by greedy k-center, anchor theta*, reset proxy optimiser state."""
        self.started = True
        self.anchors = [p.detach().clone() for p in self._params(trainer)]
        self.best_at_projection_start = max(trainer.best_score, self.projection_best)
        self.projection_best = -math.inf
        self.projection_evals_since_best = 0
        self.projection_best_state = None
        self.projection_best_proxies = None
        self.projection_start_step = trainer.step
        if self.projection == 0:
            self.initialize_from_random_samples(trainer)
        pool, mask = self.pool_embeddings(trainer)
        refresh_proxies_k_center(self.bank, pool, mask, keep_current=True)  # Alg. 2 around rho*
        proxies = self.bank.parameter  # the leaf (a feature-major bank's proxies are a view of it)
        for group in trainer.optimizer.param_groups:
            for p in group["params"]:
                if p is proxies:
                    trainer.optimizer.state.pop(p, None)
        self.radius_before = self.training_covering_radius(trainer)

    @staticmethod
    def per_class_rows(
        labels: torch.Tensor, num_classes: int, per_class: int, generator: torch.Generator,
        eligible: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[C, per_class]`` random dataset rows of each class (``-1`` padding) and their mask.

        Rows where ``eligible`` is False are never chosen: the first ``per_class`` rows of
        each class in :func:`~dmlkit.data.splits.shuffle_within_classes` order.
        """
        order, rank = shuffle_within_classes(labels, generator, eligible)
        sorted_labels = labels[order]
        usable = torch.bincount(labels if eligible is None else labels[eligible], minlength=num_classes)
        keep = rank < torch.minimum(usable[sorted_labels], torch.tensor(per_class))
        rows = torch.full((num_classes, per_class), -1, dtype=torch.int64)
        rows[sorted_labels[keep], rank[keep]] = order[keep]
        return rows, rows >= 0

    @torch.no_grad()
    def initialize_from_random_samples(self, trainer: TrainingState) -> None:
        """rho* <- embeddings of ``K`` random training samples per class (Alg. 1, line 2), on their own stream.

        A class with fewer than ``K`` samples keeps its other proxies as they are.
        """
        from dmlkit.evaluation.embed import embed_dataset
        from dmlkit.proxies.kcenter import gather_centers

        generator = derive_generator(trainer.cfg.seed, "asap initial proxies")
        labels = trainer.label_map(trainer.splits.train.labels)
        k = int(self.bank.proxies_per_class)
        rows, mask = self.per_class_rows(labels, len(trainer.label_map), k, generator)
        subset = trainer.splits.train.subset(rows[mask], relabel=False)
        emb, _ = embed_dataset(trainer.model, subset, trainer.cfg.eval.batch_size, trainer.cfg.data.num_workers)
        samples = torch.zeros(rows.shape[0], k, emb.shape[1])
        samples[mask] = emb
        picks = torch.where(mask, torch.arange(k)[None, :], -1)
        current = self.bank.per_class().detach().cpu()
        self.bank.set_proxies(gather_centers(samples, picks, fallback=current).to(self.bank.proxies.device))

    @torch.no_grad()
    def pool_embeddings(self, trainer: TrainingState) -> tuple[torch.Tensor, torch.Tensor]:
        """``[C, b, D]`` embeddings of ``b`` random samples per class and the ``[C, b]`` validity mask.

        ``pool_source="forward"`` embeds them with the current model (the paper's way);
        ``"cache"`` takes the latest training-batch embeddings of cached samples (no forward
        pass), falling back to a forward pass while some class has nothing cached.
        """
        from dmlkit.evaluation.embed import embed_dataset

        labels = trainer.label_map(trainer.splits.train.labels)
        num_classes = len(trainer.label_map)
        b = self.cfg.pool_size
        if self.cache is not None:
            filled = self.cache_filled.cpu()
            cached_classes = torch.bincount(labels[filled], minlength=num_classes)
            if bool((cached_classes > 0).all()):
                rows, mask = self.per_class_rows(labels, num_classes, b, self.generator, filled)
                return self.cache[rows.clamp_min(0).to(self.device)].cpu() * mask[:, :, None], mask
        rows, mask = self.per_class_rows(labels, num_classes, b, self.generator)
        subset = trainer.splits.train.subset(rows[mask], relabel=False)
        emb, _ = embed_dataset(trainer.model, subset, trainer.cfg.eval.batch_size, trainer.cfg.data.num_workers)
        out = torch.zeros(num_classes, b, emb.shape[1])
        out[mask] = emb
        return out, mask

    @torch.no_grad()
    def training_covering_radius(self, trainer: TrainingState, per_class: int = 16) -> float:
        """ASAP App. A.3.1: mean over k of the greedy k-center radius of up to ``per_class`` training embeddings per class."""
        from dmlkit.evaluation.embed import embed_dataset

        generator = derive_generator(trainer.cfg.seed, "asap_covering_radius")
        labels = trainer.label_map(trainer.splits.train.labels)
        rows, mask = self.per_class_rows(labels, len(trainer.label_map), per_class, generator)
        subset = trainer.splits.train.subset(rows[mask], relabel=False)
        emb, _ = embed_dataset(trainer.model, subset, trainer.cfg.eval.batch_size, trainer.cfg.data.num_workers)
        points = torch.zeros(rows.shape[0], per_class, emb.shape[1])
        points[mask] = emb
        return float(average_covering_radius(points, mask).mean())

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        return {
            "projection": self.projection,
            "started": self.started,
            "projection_best": self.projection_best,
            "projection_evals_since_best": self.projection_evals_since_best,
            "projection_start_step": self.projection_start_step,
            "projections_without_improvement": self.projections_without_improvement,
            "best_at_projection_start": self.best_at_projection_start,
            "radius_before": self.radius_before,
            "generator": self.generator.get_state(),
            "anchors": list(self.anchors),
            "projection_best_state": self.projection_best_state or {},
            "projection_best_proxies": (
                self.projection_best_proxies if self.projection_best_proxies is not None else torch.zeros(0)
            ),
            "cache": self.cache if self.cache is not None else torch.zeros(0),
            "cache_filled": self.cache_filled if self.cache_filled is not None else torch.zeros(0, dtype=torch.bool),
        }

    def load_state_dict(self, state: dict) -> None:
        self.projection = int(state["projection"])
        self.started = bool(state["started"])
        self.projection_best = float(state["projection_best"])
        self.projection_evals_since_best = int(state["projection_evals_since_best"])
        self.projection_start_step = int(state["projection_start_step"])
        self.projections_without_improvement = int(state["projections_without_improvement"])
        self.best_at_projection_start = float(state["best_at_projection_start"])
        self.radius_before = float(state["radius_before"])
        self.generator.set_state(state["generator"])
        self.anchors = [a.to(self.device, copy=True) for a in state["anchors"]]
        self.projection_best_state = dict(state["projection_best_state"]) or None
        best_proxies = state.get("projection_best_proxies", torch.zeros(0))  # absent in older checkpoints
        self.projection_best_proxies = best_proxies.to(self.bank.proxies.device, copy=True) if best_proxies.numel() else None
        if self.cache is not None:
            self.cache = state["cache"].to(self.device, copy=True)
            self.cache_filled = state["cache_filled"].to(self.device, copy=True)
