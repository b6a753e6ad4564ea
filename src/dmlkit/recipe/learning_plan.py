"""Frozen stages and cached views that buy the most learning in the time budget.

On a CPU without native bf16 a fine-tuning step of EfficientNet-Lite0 with its first 2 feature
stages frozen cost 7.3 s for 64 photos at 224 px, and the 720-s budget of the 84-px development set
bought 5 steps. The frozen stages, though, need not run at every step: behind the feature cache
(:mod:`dmlkit.engine.frozen_stage_cache`) they run once per cached view, and a step runs only the
stages that train. Each further frozen stage makes both the step and the cache's stored features
smaller. So before the splits are decoded, :func:`measure_stage_costs` times on this machine, for
each frozen-stage count ``k`` from the recipe's up to the backbone's last stage, a pass of the stem
and the ``k`` frozen stages (what a cached view costs per image) and a training step from their
output (forward and backward of the rest, per image), and :func:`plan_learning` predicts the
steps each ``k`` buys:

    left  = budget x (1 - SAFETY_MARGIN) - spent - (val x (1 + evaluations) + test) x embed
    steps = (left - V x images x prefix_k) / (batch x step_k)          (V cached views)
    steps = left / (batch x (prefix_k + step_k))                       (no cache)

with ``V`` the most views that leave :data:`~dmlkit.recipe.feature_cache_plan.EPOCHS_PER_VIEW` epochs of steps
per view (one view when its steps make an epoch), or no cache when that buys more steps. The steps are capped at
the recipe's ceiling (``train.max_steps``), so the views are sized for the steps the run takes. The rule: the
fewest frozen stages (the most layers trained) whose plan buys :data:`TARGET_STEPS` steps (or the ceiling, when
lower); when none does, the count that buys the most, and the plan says that it is short of the target and why.

The plan is made twice: first before the splits are decoded (the frozen stages the probe model is measured with),
then again from the same costs once the recipe has chosen the batch and the step ceiling
(:func:`refit_to_recipe`), so what a dry run prints is what the run takes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from dmlkit.engine.timing import one_thread, timings
from dmlkit.recipe import budget_planner as budget
from dmlkit.recipe.feature_cache_plan import EPOCHS_PER_VIEW, MAX_VIEWS, memory_cap
from dmlkit.recipe.kept_costs import smaller_seconds
from dmlkit.recipe.measurements import Measurements

#: Steps a plan should buy for fine-tuning to show on validation classes (the budget's :data:`FEW_STEPS`): on the
#: mini-ImageNet and grocery folders' validation classes, Lite2 with 4 frozen stages trained about this long did
#: as well as 5 frozen stages trained 700-1,000 steps or better (docs/recipes.md), so a plan trains more stages
#: once they buy this many.
TARGET_STEPS = budget.FEW_STEPS

#: Images per timed pass (the speed per image at the run's batches of ~64 is a little better: the plan errs low).
TIMED_BATCH = 8

#: Timed passes of each cost (the fastest kept). Five did not steady the plan more than two: what moves a cost
#: between dry runs lasts longer than a probe (beside a competing process every pass of a one-thread probe ran
#: 10-50 % slower in CPU time), and each pass costs planning time.
TIMED_PASSES = 2

#: Images per timed pass under a small budget (:data:`~dmlkit.recipe.backbone_choice.SMALL_BUDGET`): the probes
#: stay a small share of it (the cost per image of a CPU pass hardly depends on the batch).
SMALL_TIMED_BATCH = 4


@dataclass(frozen=True)
class StageCost:
    """Seconds per training image with ``frozen_stages`` frozen: through the frozen stages (a cached view),
    and a training step from their output (forward + backward of the rest); bytes of one cached view."""

    frozen_stages: int
    prefix: float
    step: float
    view_bytes: int = 0


def least_stage_costs(fresh: Sequence[StageCost], kept: Sequence[StageCost]) -> list[StageCost]:
    """Each frozen-stage count's seconds the smaller of its fresh and kept timings (this machine's kept costs,
    :mod:`dmlkit.recipe.kept_costs`), sorted by frozen stages: a count timed only now stays as timed, and one the
    measuring allowance left out now (a loaded machine spends it sooner) is read as kept."""
    earlier = {cost.frozen_stages: cost for cost in kept}
    out = dict(earlier)
    for cost in fresh:
        before = earlier.get(cost.frozen_stages)
        if before is not None and before.view_bytes != cost.view_bytes:
            raise ValueError(f"kept {cost.frozen_stages}-frozen costs are of another view size")
        out[cost.frozen_stages] = cost if before is None else dataclasses.replace(
            cost, prefix=min(cost.prefix, before.prefix), step=min(cost.step, before.step))
    return [out[count] for count in sorted(out)]


@dataclass(frozen=True)
class LearningPlan:
    """The frozen stages and cached views chosen, the steps predicted, and why (one line per candidate)."""

    frozen_stages: int
    views: int
    steps: int
    reason: str
    embedding_seconds: float = 0.0  # the validations and the test split, untrained or not
    too_small: str = ""  # a budget that trains nothing: what it buys instead, in one line (else empty)
    inputs: dict = dataclasses.field(default_factory=dict, compare=False)  # plan_learning's arguments (refit)


def _steps_for(cost: StageCost, left: float, images: int, batch: int, most_views: int,
               target: int, ceiling: int | None = None) -> tuple[int, int]:
    """(steps, cached views) that ``left`` seconds buy with ``cost``: the better of no cache and the most views
    (up to ``most_views``) that still leave :data:`~dmlkit.recipe.feature_cache_plan.EPOCHS_PER_VIEW` epochs of steps
    per view (one view when the steps it buys make at least one epoch: it costs one pass, each epoch without it one)
    and, beyond one view, ``target`` steps (steps first, then the crops' variety). Steps are capped at ``ceiling``
    (the recipe's ``train.max_steps``): views are counted for the steps taken, and where both reach the ceiling
    the cache is taken when it takes less time."""
    def capped(steps: int) -> int:
        return steps if ceiling is None else min(steps, int(ceiling))

    def seconds(steps: int, views: int) -> float:
        return views * images * cost.prefix + steps * batch * (cost.step + (0.0 if views else cost.prefix))

    best = (capped(int(max(0.0, left) / max(batch * (cost.prefix + cost.step), 1e-12))), 0)
    least = target if ceiling is None else min(target, int(ceiling))
    for views in range(1, max(1, most_views) + 1):
        steps = capped(int(max(0.0, left - views * images * cost.prefix) / max(batch * cost.step, 1e-12)))
        epochs = steps * batch / max(images, 1)
        if epochs < (1 if views == 1 else EPOCHS_PER_VIEW * views) or (views > 1 and steps < least):
            break
        # a cache that beats none (more steps, or the same capped steps sooner), then as many views as steps serve
        if steps > best[0] or best[1] or (steps == best[0] and seconds(steps, views) < seconds(*best)):
            best = (steps, views)
    return best


def plan_learning(*, time_budget: float, spent: float, train_images: int, batch: int, val_images: int,
                  test_images: int, embed_seconds: float, costs: Sequence[StageCost],
                  memory: int | None = None, target: int = TARGET_STEPS, ceiling: int | None = None) -> LearningPlan:
    """The frozen-stage count and cached views that buy the most learning (module docstring), and why.

    ``ceiling``: the recipe's ``train.max_steps`` (None: not chosen yet): no plan takes more steps, and the
    target is the ceiling where it is lower.
    ``embed_seconds`` is one embedded image (mirror included when the run averages it); the validations
    are the step-0 one and the evaluations :func:`dmlkit.recipe.budget_planner.evaluation_count` spreads.
    ``memory`` caps the cached views' bytes (None: :func:`~dmlkit.recipe.feature_cache_plan.memory_cap`).
    """
    if not costs:
        raise ValueError("plan_learning needs the cost of at least one frozen-stage count.")
    inputs = dict(time_budget=time_budget, spent=spent, train_images=train_images, batch=batch, val_images=val_images,
                  test_images=test_images, embed_seconds=embed_seconds, costs=list(costs), memory=memory,
                  target=target, ceiling=ceiling)
    target = target if ceiling is None else min(target, int(ceiling))
    cap = memory_cap() if memory is None else memory
    evaluations = budget.evaluation_count(time_budget, val_images * embed_seconds) if val_images else 0
    embedding = (val_images * (1 + evaluations) + test_images) * embed_seconds
    left = time_budget * (1.0 - budget.SAFETY_MARGIN) - spent - embedding
    rows, bought = [], {}
    for cost in sorted(costs, key=lambda c: c.frozen_stages):
        most = min(MAX_VIEWS, cap // max(cost.view_bytes * train_images, 1)) if cost.view_bytes else MAX_VIEWS
        steps, views = _steps_for(cost, left, train_images, batch, int(most), target, ceiling)
        bought[cost.frozen_stages] = (steps, views)
        cache = (f"{views} cached views ({views * train_images * cost.prefix:.0f} s), "
                 f"{batch * cost.step:.2f} s a step" if views else
                 f"no cache, {batch * (cost.prefix + cost.step):.2f} s a step")
        at_ceiling = " (the ceiling, train.max_steps)" if ceiling is not None and steps >= ceiling else ""
        rows.append(f"{cost.frozen_stages} frozen: {cache} -> {steps} steps{at_ceiling}")
    enough = [k for k, (steps, _) in bought.items() if steps >= target]
    chosen = min(enough) if enough else max(bought, key=lambda k: (bought[k][0], -k))
    steps, views = bought[chosen]
    head = (f"{val_images} validation images x {1 + evaluations} evaluations and "
            f"{test_images} test images take {embedding:.0f} s ({embed_seconds * 1000:.1f} ms an image), "
            f"{max(left, 0.0):.0f} s of the {time_budget:.0f}-s budget are left to train")
    too_small = ""
    if enough:
        why = f"the fewest frozen stages whose plan buys {target} steps"
    else:
        why = (f"SHORT OF {target} STEPS: no frozen-stage count buys them on this machine (the embeddings alone take "
               f"{embedding:.0f} s); {chosen} frozen buys the most")
    if steps == 0:  # said before the budget is spent: what the budget buys instead, and what would train
        per_step = min(batch * (c.prefix + c.step) for c in costs)  # the cheapest step, without a cache
        needed = (time_budget - left + target * per_step) / (1.0 - budget.SAFETY_MARGIN)
        too_small = (f"the {time_budget:.0f}-s budget is too small to train here ({spent:.0f} s spent before the plan, "
                     f"{embedding:.0f} s of embeddings): the pretrained backbone alone, evaluated in about "
                     f"{val_images * 2 * embed_seconds + test_images * embed_seconds:.0f} s, is what it buys; "
                     f"train.time_budget={needed:.0f} would train {target} steps")
    return LearningPlan(chosen, views, steps, f"{why}; {head}; measured: " + "; ".join(rows), embedding, too_small,
                        inputs)


def _frozen_to(model: nn.Module, count: int, trainable: Mapping[nn.Parameter, bool]) -> None:
    """``model``'s trunk trained from stage ``count`` on: the parameters' original flags, then ``count`` frozen."""
    for param, flag in trainable.items():
        param.requires_grad_(flag)
    model.trunk.freeze_stages(count)


def measure_stage_costs(model: nn.Module, counts: Sequence[int], crop: int, *, device: torch.device,
                        dtype: torch.dtype | None, passes: list[list[float]] | None = None,
                        batch: int = TIMED_BATCH, enough: Callable[[], bool] | None = None) -> list[StageCost]:
    """A :class:`StageCost` for each frozen-stage count in ``counts`` (at least the model's own), timed on
    ``batch`` random crops of ``crop`` px under the run's autocast (the fastest of :data:`TIMED_PASSES` passes each; every pass's
    seconds appended to ``passes``), in the order given; ``enough()`` (the plan's measuring allowance spent) is
    asked after each count beyond the first two, and ends the measurement early. Sorted by frozen stages; the
    model is left as it was."""
    passes = [] if passes is None else passes
    trainable = {p: p.requires_grad for p in model.parameters()}
    was_training, own = model.training, model.trunk.frozen_stages
    x = torch.randn(batch, 3, crop, crop, device=device)
    out = []
    try:
        with torch.random.fork_rng(devices=[]), one_thread(device):  # the warm-ups too: see one_thread
            for count in counts:
                if len(out) >= 2 and enough is not None and enough():
                    break
                _frozen_to(model, count, trainable)
                model.train()
                with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    kept: list[torch.Tensor] = []
                    features = model.prefix(x[:1])

                    def through_prefix() -> None:  # the output kept: the steps start from it, with no extra pass
                        kept[:] = [model.prefix(x)]

                    def step() -> None:
                        loss = model.forward_from_prefix(features).float().square().sum()
                        loss.backward()
                        model.zero_grad(set_to_none=True)

                    step()  # warm-up: allocations, kernels
                    prefix = timings(through_prefix, device, TIMED_PASSES)
                    features = kept[0]
                    seconds = timings(step, device, TIMED_PASSES)
                passes += [prefix, seconds]
                out.append(StageCost(count, prefix[0] / len(x), seconds[0] / len(x), features[:1].numel() * 2))
    finally:
        _frozen_to(model, own, trainable)
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    return sorted(out, key=lambda cost: cost.frozen_stages)


def embed_seconds(model: nn.Module, size: int, *, device: torch.device, dtype: torch.dtype | None,
                  passes: list[list[float]] | None = None, batch: int = TIMED_BATCH) -> float:
    """Seconds per embedded image at ``size`` px (eval mode, the model's mirror average), timed on a batch (the
    fastest of :data:`TIMED_PASSES` passes; their seconds appended to ``passes``)."""
    was_training = model.training
    x = torch.randn(batch, 3, size, size, device=device)
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None), one_thread(device):
            model(x[:1])
            timed = timings(lambda: model(x), device, TIMED_PASSES)
            if passes is not None:
                passes.append(timed)
            return timed[0] / len(x)
    finally:
        model.train(was_training)


__all__ = ["LearningPlan", "StageCost", "TARGET_STEPS", "embed_seconds", "least_stage_costs", "measure_stage_costs",
           "plan_learning", "refit_to_recipe"]


def plans_learning(cfg: Any, model: nn.Module, model_choices: Mapping[str, tuple[Any, str]]) -> bool:
    """Whether the frozen stages are planned: the recipe chose them (a pretrained timm backbone on a CPU), the run
    leaves the steps to the recipe (so the run has a time budget: ``train.time_budget`` or the default), the model's trunk
    splits after its frozen stages (:meth:`~dmlkit.models.Embedder.prefix_problem`), one model, the feature cache
    not switched off, its views and the training crops left to the recipe."""
    t = cfg.train
    return bool(model_choices.get("model.frozen_stages", (0,))[0]) and t.max_steps is None and t.feature_cache == "auto" \
        and t.cache_views is None and (cfg.model.ensemble or 1) == 1 and cfg.data.augment in ("auto", "crop") \
        and hasattr(model, "prefix_problem") and model.prefix_problem() is None


def plan_frozen_stages(cfg: Any, survey: Any, model: nn.Module, model_choices: Mapping[str, tuple[Any, str]], *,
                 device: torch.device, spent: float, measurements: Measurements | None = None,
                 planned: list | None = None, embed_cost: Callable[[int], float] | None = None
                 ) -> dict[str, tuple[Any, str]]:
    """``model.frozen_stages`` and ``train.cache_views`` (``{field: (value, reason)}``, written into ``cfg``, the
    frozen stages into ``model``) that :func:`plan_learning` chooses from costs measured now; ``{}`` when
    :func:`plans_learning` says no. ``spent``: seconds of the run gone so far. The plan's views are built before
    the first step (timed without them, steps would run the frozen stages and look too slow to cache); a plan
    without views leaves the cache to the budget's first plan. Under a small budget the costs are timed on fewer
    images and an embedded image's cost is estimated from them (the whole prefix and a third of the rest's step:
    its forward), and the frozen-stage counts between the two ends are measured only while the plan's measuring
    allowance lasts
    (:meth:`~dmlkit.recipe.measurements.Measurements.allowance_spent`). ``measurements``: the
    run's (the costs and ``spent`` kept and replayed through them); ``planned``: the :class:`LearningPlan` is
    appended to it (the steps it predicts, and whether the budget trains at all). ``embed_cost(size)``: seconds
    per image embedded at ``size`` px with the mirror, as the backbone choice measured this backbone (None:
    measured here). The plan is made again by :func:`refit_to_recipe` once the recipe chose the batch and the
    step ceiling."""
    from dmlkit.engine import distributed
    from dmlkit.recipe import backbone_choice
    from dmlkit.recipe import rules as recipe

    if not plans_learning(cfg, model, model_choices) or distributed.torchrun_local_rank() is not None:
        return {}
    own = int(cfg.model.frozen_stages)
    stages = len(getattr(model.trunk.model, "feature_info", None) or [])
    dtype = backbone_choice._run_autocast_dtype(cfg, device)
    size = int(cfg.data.image_size or recipe.PHOTO_TRAIN_SIZE)
    crop = int(cfg.data.crop_size or size)
    tape = measurements if measurements is not None else Measurements.live()
    budget_s = float(cfg.train.time_budget if cfg.train.time_budget is not None else budget.DEFAULT_TIME_BUDGET)
    small = budget_s < backbone_choice.SMALL_BUDGET
    batch = SMALL_TIMED_BATCH if small else TIMED_BATCH
    counts, passes = list(range(own, stages + 1)), []
    # the two ends first (the most layers trained, the cheapest step), then the others while the allowance lasts
    order = [counts[-1], *counts[:-1]] if len(counts) > 1 else counts
    name = f"{type(model.trunk.model).__name__} at {crop} px, {dtype}, {device}"
    costs = tape.measure(f"frozen-stage costs of {name}, {counts[0]}-{counts[-1]} frozen",
                         lambda: measure_stage_costs(model, order, crop, device=device, dtype=dtype, passes=passes,
                                                     batch=batch, enough=tape.allowance_spent),
                         encode=lambda found: [dataclasses.asdict(cost) for cost in found],
                         decode=lambda kept: [StageCost(**cost) for cost in kept], timings=lambda _found: passes,
                         lower=least_stage_costs)
    views = 2.0 if getattr(model, "flip_average", False) else 1.0
    if embed_cost is not None:  # the backbone choice timed this backbone's embedding already (mirror included)
        per_image = embed_cost(size) * views / 2.0
    elif small:  # from the costs just measured: the whole prefix and the rest's forward, at the view's size
        last = max(costs, key=lambda cost: cost.frozen_stages)
        per_image = (last.prefix + last.step / 3.0) * (size / crop) ** 2 * views
    else:
        per_image = tape.measure(f"embedding seconds per image of {name} at {size} px",
                                 lambda: embed_seconds(model, size, device=device, dtype=dtype, passes=passes,
                                                       batch=batch),
                                 timings=lambda _seconds: passes[-1:], lower=smaller_seconds)
    spent = tape.spent("seconds spent before the learning plan", spent)
    train_images, to_embed = backbone_choice._images_to_embed(cfg, survey)
    test_images = sum(len(getattr(survey, split)) for split in ("test", "query", "gallery")
                      if getattr(survey, split, None) is not None)
    val_images = (to_embed - test_images) // (1 + recipe.FINETUNE_EVALUATIONS)
    plan = plan_learning(time_budget=budget_s, spent=spent, train_images=max(train_images, 1),
                         batch=int(cfg.sampler.batch_size or 64), val_images=val_images, test_images=test_images,
                         embed_seconds=per_image, costs=costs)
    if planned is not None:
        planned.append(plan)
    return _apply_plan(cfg, model, plan)


def _apply_plan(cfg: Any, model: nn.Module, plan: LearningPlan) -> dict[str, tuple[Any, str]]:
    """``plan``'s frozen stages and cached views written into ``cfg`` (the frozen stages into ``model``), as
    ``{field: (value, reason)}``; no cached views: ``train.cache_views`` left to the feature cache's rule."""
    from dmlkit.recipe import rules as recipe

    choices: dict[str, tuple[Any, str]] = {"model.frozen_stages": (plan.frozen_stages, f"planned for learning: {plan.reason}")}
    if plan.views:  # the views sized for the plan's steps, built before the first step
        choices["train.cache_views"] = (plan.views, f"the plan's {plan.steps} steps from {plan.views} cached views "
                                                    "of the frozen stages' output, built before the first step")
    else:
        cfg.train.cache_views = None
    recipe.apply(cfg, choices)
    if model.trunk.frozen_stages != plan.frozen_stages:
        model.trunk.freeze_stages(plan.frozen_stages)
    return choices


def refit_to_recipe(cfg: Any, model: nn.Module, plan: LearningPlan, splits: Any, *, spent: float
                    ) -> tuple[LearningPlan, dict[str, tuple[Any, str]]]:
    """The learning plan made again from the same costs once the recipe chose the batch and the step ceiling
    (``cfg.sampler.batch_size``, ``cfg.train.max_steps``) and held out the validation classes (``splits``), with
    ``spent`` seconds gone: the frozen stages, cached views and steps the run takes (written into ``cfg`` and
    ``model`` as :func:`plan_frozen_stages` writes them), and the choices."""
    test_images = sum(len(getattr(splits, split)) for split in ("test", "query", "gallery")
                      if getattr(splits, split, None) is not None)
    refit = plan_learning(**{**plan.inputs, "spent": spent, "train_images": max(len(splits.train), 1),
                             "batch": int(cfg.sampler.batch_size or plan.inputs["batch"]),
                             "val_images": len(splits.val) if getattr(splits, "val", None) is not None else 0,
                             "test_images": test_images, "ceiling": cfg.train.max_steps})
    return refit, _apply_plan(cfg, model, refit)
