"""Steps, ensemble members and validations of a model trained from scratch, planned to the time budget.

The glyph recipe (small images held in memory, a small CNN from scratch: ``docs/recipes.md``) was
shaped on a CPU with native bf16; on a CPU without it the same plan takes about three times as long
(measurements: ``docs/recipes.md``, *Glyphs planned to the machine*). So once the recipe has read
the training split, and before the model is built again as an ensemble,
:func:`measure_glyph_costs` times on this machine one member's training step at the run's batch
(forward, the run's loss, backward and the optimiser's update of the member and its loss), the
batch augmentation the members share, and one member's embedding of an image (its shifts included),
and :func:`plan_glyphs` fits the recipe's plan into ``train.time_budget``:

    embedding(N) = (val x evaluations x val_embed + test x embed) x N            (N members)
    left(N)      = budget x (1 - SAFETY_MARGIN) - spent - embedding(N)
    steps(N)     = left(N) / (shared + N x step)

with ``evaluations`` the recipe's (:data:`dmlkit.recipe.rules.SCRATCH_EVALUATIONS`), fewer when the budget binds
(:func:`dmlkit.recipe.budget_planner.evaluation_count`). The rule: the recipe's members and steps when they
fit; else the most members (up to the recipe's) whose plan buys at least :data:`MIN_STEP_SHARE` of
the recipe's steps at the measured speed (times :data:`STEP_MARGIN`, 1) (members go before
steps); when no count does, one member with the steps it buys, but never fewer than :data:`FLOOR_SHARE` of
the recipe's when the recipe chose the budget (which is then raised).
The trainer's own plan (:mod:`dmlkit.recipe.budget_planner`) still re-times the steps once training runs.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from torch import nn

from dmlkit.engine.optim import fused_capable
from dmlkit.engine.timing import timings
from dmlkit.recipe import budget_planner as budget
from dmlkit.recipe.measurements import Measurements
from dmlkit.recipe.rules import evaluation_interval, evaluations_over

#: A plan keeps an ensemble member only while the steps it buys are at least this share of the recipe's: on
#: Omniglot's training characters one more member was worth the last ~12 % of the steps (the cosine schedule's last
#: steps add little), not a fifth of them (measurements: docs/recipes.md, *Glyphs planned to the machine*).
MIN_STEP_SHARE = 0.85

#: The member count is chosen as if every step ran this much slower than measured. 1: the median of 9 timed steps
#: already matches the trainer's steps (median 1.04x), and any margin turned down members that would have fit; the
#: trainer cuts the steps when they run slower (measurements: docs/recipes.md, *Glyphs planned to the machine*).
STEP_MARGIN = 1.0

#: A budget the recipe chose (not one set by hand) is raised rather than cut a model trained from scratch below this
#: share of the recipe's steps: a few dozen steps from random weights give an embedding of no use, and on a machine
#: that busy the run had better take longer (the plan says so).
FLOOR_SHARE = 0.25

#: Steps timed for a member's training step (their median is taken: the best of five read 10 ms where the run's
#: steps then took 13), after WARM_UP_STEPS untimed ones (the first steps of a fresh model run slower).
TIMED_STEPS = 9
WARM_UP_STEPS = 2

#: Images per timed embedding pass (one member, eval mode, no shifts).
TIMED_IMAGES = 64


@dataclass(frozen=True)
class GlyphCosts:
    """Seconds on this machine: one member's training step at the run's batch, one member's embedding of one
    image with every shift it averages (``views`` passes; a validation image ``val_views``), and what a step costs
    once for all members (``shared``: the batch augmentation; with ``own_batches``, ``protocol.member_folds``, each
    member's)."""

    step: float
    embed: float
    views: int = 1
    shared: float = 0.0
    own_batches: bool = False
    val_views: int | None = None

    @property
    def val_embed(self) -> float:
        """One member's embedding of a validation image: ``val_views`` passes (``eval.val_shift_average``), else as
        a test image."""
        return self.embed if self.val_views is None else self.embed * self.val_views / self.views

    def fastest(self, other: "GlyphCosts") -> "GlyphCosts":
        """Each cost the smaller of the two timings of the same work (interruptions only add time)."""
        if other.views != self.views or (other.shared > 0) != (self.shared > 0):
            raise ValueError("the two glyph timings are of different work (views or augmentation)")
        return dataclasses.replace(self, step=min(self.step, other.step), embed=min(self.embed, other.embed),
                                   shared=min(self.shared, other.shared))

    def steps_seconds(self, steps: int, members: int) -> float:
        """Seconds of ``steps`` training steps of ``members`` members (``own_batches``: each member its own batch,
        augmented with the others' in one call: ``shared`` per member)."""
        return steps * (self.shared * (members if self.own_batches else 1) + members * self.step)


@dataclass(frozen=True)
class GlyphPlan:
    """Members, steps and validations chosen; ``seconds`` the predicted end (from the run's start); ``binds``:
    the recipe's plan did not fit; ``reason`` says what was measured and why."""

    members: int
    steps: int
    evaluations: int
    eval_every: int
    seconds: float
    binds: bool
    reason: str


def plan_glyphs(*, time_budget: float, spent: float, steps: int, members: int, evaluations: int, val_images: int,
                test_images: int, costs: GlyphCosts, floor: int = 1) -> GlyphPlan:
    """The members, steps and validation count that fit ``time_budget`` seconds, ``spent`` of them gone (module
    docstring). ``steps``, ``members`` and ``evaluations`` are the recipe's (``evaluations`` 0 without validation).
    ``floor``: the fewest steps planned (one member then; ``seconds`` may then exceed the budget, and the reason
    says by how much)."""
    if steps < 1 or members < 1:
        raise ValueError(f"plan_glyphs needs steps >= 1 and members >= 1. Got steps={steps}, members={members}.")
    usable = time_budget * (1.0 - budget.SAFETY_MARGIN) - spent
    options = []  # (members, steps planned, validations, seconds left for steps, steps bought at the measured speed)
    holds = STEP_MARGIN * MIN_STEP_SHARE * steps  # steps a member count must buy to keep its share when slower
    for n in range(members, 0, -1):
        per_val = val_images * costs.val_embed * n
        evals = min(evaluations, budget.evaluation_count(time_budget, per_val)) if val_images and evaluations else 0
        full = usable - (per_val * evaluations + test_images * costs.embed * n)
        if full >= costs.steps_seconds(steps, n):  # the recipe's steps and validations fit with n members
            options.append((n, steps, evaluations, full, int(full / max(costs.steps_seconds(1, n), 1e-12))))
        else:
            left = usable - (per_val * evals + test_images * costs.embed * n)
            bought = int(left / max(costs.steps_seconds(1, n), 1e-12))
            options.append((n, max(1, min(steps, bought)), evals, left, bought))
        if options[-1][4] >= holds:  # fewer members would only lose
            break
    fits = [o for o in options if o[1] == steps and o[0] == members and (o[4] >= holds or members == 1)]
    enough = [o for o in options if o[4] >= holds]
    n, planned, evals, left, _ = fits[0] if fits else enough[0] if enough else options[-1]
    floored = planned < floor
    planned = max(planned, min(floor, steps))
    every = evaluation_interval(planned, evals) if evals else planned
    seconds = spent + costs.steps_seconds(planned, n) + (val_images * costs.val_embed * evals
                                                         + test_images * costs.embed) * n
    measured = (f"measured here: {costs.step * 1000:.0f} ms a training step of one member"
                + (f" and {costs.shared * 1000:.1f} ms a batch's augmentation"
                   + (" (each member's batch)" if costs.own_batches else "") if costs.shared else "")
                + f", {costs.embed * 1000:.2f} ms an embedded image per member"
                + (f" ({costs.views} shifts)" if costs.views > 1 else ""))
    if fits:
        reason = (f"the recipe's {steps} steps of {members} member(s) and {evaluations} validation(s) fit the "
                  f"{time_budget:.0f}-s budget (predicted end {seconds:.0f} s); {measured}")
        return GlyphPlan(members, steps, evaluations, every, seconds, False, reason)
    rows = "; ".join(f"{o[0]} member(s): {o[1]} steps" for o in options)
    share = (f"the recipe's {steps} steps" if MIN_STEP_SHARE >= 1 else f"{MIN_STEP_SHARE:.0%} of the recipe's {steps} "
             "steps") + (f" with steps {STEP_MARGIN:g}x slower than measured" if STEP_MARGIN != 1 else "")
    why = (f"the most members that still buy {share} (members go before steps: validation characters)"
           if enough else f"no member count buys {share}: one member, with the steps that fit")
    if floored:
        why += f", and no fewer than {planned} steps from scratch: the run takes longer than the budget"
    reason = (f"the recipe's {steps} steps of {members} member(s) do not fit the {time_budget:.0f}-s budget on this "
              f"machine; {why}: {n} member(s), {planned} steps, {evals} validation(s) (predicted end {seconds:.0f} s, "
              f"{spent:.0f} s spent before the plan); {measured}; options: {rows}")
    return GlyphPlan(n, planned, evals, every, seconds, True, reason)


def measure_glyph_costs(model: nn.Module, batch: int, shape: tuple[int, int, int], *, views: int,
                        device: torch.device, dtype: torch.dtype | None,
                        clock: Callable[[], float] | None = None, objective: nn.Module | None = None,
                        labels: torch.Tensor | None = None, augment: Callable | None = None,
                        passes: list[list[float]] | None = None) -> GlyphCosts:
    """:class:`GlyphCosts` of one member (``model``, a single embedder) on random images of ``shape`` ``[C, H, W]``:
    a training step at ``batch`` (forward, ``objective(embeddings, labels)``, backward and the update of a copy of
    the model and the objective by the AdamW the run gets, at learning rate 0; the median of :data:`TIMED_STEPS` after
    :data:`WARM_UP_STEPS`; without ``objective`` a sum of squares stands in), ``augment(images, generator)`` on the
    batch (``shared``, once per step for all members) and an eval-mode embedding per image times ``views`` (its
    shifts); every timed pass's seconds are appended to ``passes``. ``model``, ``objective`` and the global random
    state are left as they were."""
    passes = [] if passes is None else passes
    member = copy.deepcopy(model).to(device)
    if device.type == "cpu":
        member = member.to(memory_format=torch.channels_last)
    loss_fn = copy.deepcopy(objective).to(device) if objective is not None else None
    params = [p for module in (member, loss_fn) if module is not None for p in module.parameters() if p.requires_grad]
    groups = [{"params": params}]
    optimizer = torch.optim.AdamW(groups, lr=0.0, **({"fused": True} if fused_capable(groups) else {}))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *shape, generator=g).to(device)
    y = (labels if labels is not None else torch.zeros(batch, dtype=torch.int64)).to(device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)

    def step() -> None:
        with autocast:
            out = member(x)
        loss = loss_fn(out.float(), y) if loss_fn is not None else out.float().square().sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    member.train()
    for _ in range(WARM_UP_STEPS):  # oneDNN primitives, allocations, the optimiser's state
        step()
    steps = timings(step, device, TIMED_STEPS, clock)
    passes.append(steps)
    step_seconds = steps[len(steps) // 2]
    shared = 0.0
    if augment is not None:
        augment(x, g)
        augmented = timings(lambda: augment(x, g), device, TIMED_STEPS, clock)
        passes.append(augmented)
        shared = augmented[0]
    images = torch.randn(TIMED_IMAGES, *shape, generator=g).to(device)
    shift = getattr(member, "shift_average", 0)
    member.shift_average = 0  # one pass per image; the shifts are ``views`` such passes
    member.eval()

    def embed() -> None:
        with torch.no_grad(), autocast:
            member(images)

    embed()
    per_image = timings(embed, device, 2, clock)[0] / TIMED_IMAGES
    member.shift_average = shift
    return GlyphCosts(step_seconds, per_image * views, views, shared)


def plans_glyphs(cfg: Any, choices: Mapping[str, tuple[Any, str]]) -> bool:
    """Whether the recipe's steps are planned here: a model trained from scratch (not a pretrained backbone), the
    steps left to the recipe, a time budget, one process, not ASAP (its outer loop owns the schedule)."""
    from dmlkit.engine import distributed
    from dmlkit.recipe.rules import uses_pretrained_weights

    return ("train.max_steps" in choices and cfg.train.time_budget is not None and not uses_pretrained_weights(cfg)
            and not cfg.asap.enabled and distributed.torchrun_local_rank() is None)


def plan_glyph_steps(cfg: Any, splits: Any, model: nn.Module, recipe_run: Any, *, device: torch.device, spent: float,
                 objective: Callable[[int], nn.Module] | None = None, augment: Callable | None = None,
                 measurements: Measurements | None = None) -> tuple[dict[str, tuple[Any, str]], float | None]:
    """``train.max_steps``, ``train.eval_every`` and ``model.ensemble`` (those the recipe chose) as
    :func:`plan_glyphs` fits them into ``train.time_budget`` from costs measured now, written into ``cfg``,
    and the seconds the planned model takes to embed an image (every member and shift; the trainer's estimate of
    a validation until it has timed one); ``({}, None)`` when :func:`plans_glyphs` says no. ``model``: the model
    as built before the recipe (one member, or the whole ensemble when ``model.ensemble`` was set by hand: its first
    member is timed); ``recipe_run``: the data recipe's result (``planner.ResolvedRecipe``: the
    training split's profile and the recipe's choices); ``spent``: seconds of the run gone so far; ``objective``:
    builds one member's objective for a number of classes (timed with the member's step, on labels of the sampler's
    ``m`` images per class; built on a forked random state, so the run's own draws are unchanged); ``augment``: the
    run's batch augmentation (timed once per step); ``measurements``: the run's (the costs and ``spent`` kept and
    replayed through them)."""
    from dmlkit.evaluation.embed import autocast_dtype
    from dmlkit.recipe import rules as recipe

    profile, choices = recipe_run.profile, recipe_run.choices

    if not plans_glyphs(cfg, choices):
        return {}, None
    members = int(cfg.model.ensemble or 1)
    views = budget.embedding_views(cfg)
    side = cfg.data.crop_size or cfg.data.image_size  # the size the model is fed, where the data options set it
    shape = (profile.channels, side or profile.height, side or profile.width)
    member = model.members[0] if hasattr(model, "members") else model  # an ensemble set by hand is built whole
    batch, classes = int(cfg.sampler.batch_size), max(1, int(splits.train.labels.unique().numel()))
    labels = (torch.arange(batch) // max(1, int(cfg.sampler.m or 1))) % classes
    with torch.random.fork_rng(devices=[]):
        timed_objective = objective(classes) if objective is not None else None
    tape, passes = measurements if measurements is not None else Measurements.live(), []
    dtype = autocast_dtype(cfg.train.mixed_precision)
    costs = tape.measure(f"glyph step and embedding costs of {type(member).__name__}, batch {batch}, {shape}, "
                         f"{views} view(s), {dtype}, {device}",
                         lambda: measure_glyph_costs(member, batch, shape, views=views, device=device, dtype=dtype,
                                                     objective=timed_objective, labels=labels, augment=augment,
                                                     passes=passes),
                         encode=dataclasses.asdict, decode=lambda kept: GlyphCosts(**kept),
                         timings=lambda _costs: passes, lower=GlyphCosts.fastest)
    spent = tape.spent("seconds spent before the glyph plan", spent)
    # a validation image at its own shifts; with member folds each member its own batch, augmented once per member
    costs = dataclasses.replace(costs, val_views=budget.embedding_views(cfg, validation=True),
                                own_batches=bool(cfg.protocol.member_folds))
    has_val = splits.val is not None and cfg.train.eval_every is not None and cfg.train.eval_every < cfg.train.max_steps
    evaluations = max(1, evaluations_over(cfg.train.max_steps, cfg.train.eval_every)) if has_val else 0
    test = [getattr(splits, name, None) for name in ("test", "query", "gallery")]
    chose_budget = "train.time_budget" in choices  # a budget set by hand is never exceeded on purpose
    plan = plan_glyphs(time_budget=float(cfg.train.time_budget), spent=spent, steps=int(cfg.train.max_steps),
                       members=members, evaluations=evaluations, val_images=len(splits.val) if has_val else 0,
                       test_images=sum(len(s) for s in test if s is not None), costs=costs,
                       floor=math.ceil(FLOOR_SHARE * cfg.train.max_steps) if chose_budget else 1)
    planned: dict[str, tuple[Any, str]] = {"train.max_steps": (plan.steps, f"planned to the time budget: {plan.reason}")}
    needed = math.ceil(plan.seconds / (1.0 - budget.SAFETY_MARGIN))
    if chose_budget and needed > cfg.train.time_budget:  # the floor: the trainer's own plan must not cut below it
        planned["train.time_budget"] = (float(needed), f"{choices['train.time_budget'][1]}; raised from "
                                        f"{cfg.train.time_budget:.0f} s to what the plan's {plan.steps} steps need "
                                        "on this machine")
    if "train.eval_every" in choices and has_val:
        planned["train.eval_every"] = (plan.eval_every, f"{plan.evaluations} validation evaluations (planned)")
    if "model.ensemble" in choices and plan.members != members:
        planned["model.ensemble"] = (plan.members, f"{plan.members} member(s): {members} do not fit the time budget "
                                                   "with enough steps (train.max_steps)")
    if not plan.binds:
        planned = {"train.max_steps": (plan.steps, f"{choices['train.max_steps'][1]}; {plan.reason}")}
    recipe.apply(cfg, planned)
    return planned, costs.embed * plan.members


__all__ = ["FLOOR_SHARE", "GlyphCosts", "GlyphPlan", "MIN_STEP_SHARE", "STEP_MARGIN", "measure_glyph_costs",
           "plan_glyph_steps", "plan_glyphs", "plans_glyphs"]
