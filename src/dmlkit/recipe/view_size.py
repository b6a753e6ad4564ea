"""The view size of small photos, measured on the validation classes before the splits are decoded.

The recipe's photo rule (:func:`dmlkit.recipe.rules.photo_eval_size`) views every photo at 224 px
at least, so an 84-px photo is upsampled to 224 px: most of such a run's time goes to embedding and
training at a size the image cannot fill. For photos whose median shorter side is below
:data:`MEASURED_BELOW`, the untrained pretrained model embeds the validation classes (held out as
:func:`~dmlkit.recipe.planner.apply_recipe` will hold them out) at each of a handful of view sizes
(:func:`candidate_sizes`), and :func:`choose_view_size` keeps the smallest whose validation MAP@R is
not worse than the best size's by more than :data:`TOLERATED_ERRORS` standard errors of the paired
per-query AP@R differences. Training crops are then taken at that size too (``data.crop_size``).
Sizes are measured from the largest down, and the measurement stops at the first size worse than the
best so far by more than that: the smaller ones would lose too (the untrained backbone's MAP@R grows
with the view on the development sets), and their time is saved. The pooling's measurement also gives the
untrained embedding's validation MAP@R, which sets a pretrained backbone's learning rate
(:func:`dmlkit.recipe.rules.pretrained_lr_choice`).
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Mapping, NamedTuple

import torch
from torch import nn

from dmlkit.engine import distributed
from dmlkit.engine.device import native_bf16
from dmlkit.engine.rng_state import rng_state, set_rng_state
from dmlkit.engine.splits import hold_out_classes
from dmlkit.engine.timing import device_clock
from dmlkit.evaluation.embed import autocast_dtype, embed_dataset
from dmlkit.evaluation.retrieval import map_at_r_per_query, paired_gain
from dmlkit.recipe import pooling_choice
from dmlkit.recipe import rules as recipe

#: Photos whose median shorter side is below this are measured; larger ones keep the recipe's rule.
MEASURED_BELOW = recipe.PHOTO_TRAIN_SIZE

#: A smaller view is kept when its validation MAP@R is worse than the best view's by at most this many
#: standard errors of the paired per-query differences (it costs a fraction of the larger view's time).
TOLERATED_ERRORS = 1.0

#: At most this many validation images are embedded per candidate (an equal share of each class): the four
#: candidates of an 84-px photo cost about twice the embedding of as many images at 224 px.
MEASURED_IMAGES = 500


def candidate_sizes(side: int) -> list[int]:
    """View sizes measured for a median shorter side of ``side`` px: multiples of 32 from the smallest that
    holds the image up to :data:`MEASURED_BELOW` (192 only when it is the smallest: 160 and 224 bracket it),
    e.g. 96, 128, 160, 224 for 84 px."""
    top = MEASURED_BELOW
    start = max(32, -(-side // 32) * 32)
    return [size for size in range(start, top, 32) if size != 192 or size == start] + [top]


def tolerated(per_query: torch.Tensor, best: torch.Tensor) -> tuple[bool, float, float]:
    """Whether per-query AP@R ``per_query`` is not worse than ``best``'s (the same queries) by more than
    :data:`TOLERATED_ERRORS` standard errors of the paired differences; the mean difference and its error."""
    gain, error = paired_gain(per_query, best)
    return gain >= -TOLERATED_ERRORS * error, gain, error


def best_size(per_query: Mapping[int, torch.Tensor]) -> int:
    """The size with the highest mean AP@R (queries without a true reference left out); ties: the smaller."""
    scores = {size: float(ap.nanmean()) for size, ap in per_query.items()}
    return max(sorted(scores), key=lambda size: scores[size])  # the first (smallest) of equal maxima


def choose_view_size(per_query: Mapping[int, torch.Tensor]) -> tuple[int, str]:
    """The smallest size whose per-query AP@R (``{size: [N] AP@R}``, the same queries) is :func:`tolerated` beside
    the :func:`best_size`'s; and why. Equal scores are within any tolerance, so ties go to the smallest size."""
    if not per_query:
        raise ValueError("choose_view_size needs at least one candidate size.")
    best = best_size(per_query)
    if len(per_query) == 1:
        return best, f"{best} px, the only candidate"
    for size in sorted(per_query):
        kept, gain, error = tolerated(per_query[size], per_query[best])
        if kept:
            break
    if size == best:
        return size, f"{size} px has the best validation MAP@R"
    return size, (f"{size} px: the smallest view within {TOLERATED_ERRORS:g} standard error of the best ({best} px: "
                  f"{gain:+.4f} +- {error:.4f})")


def _photo_files(cfg: Any, survey: Any) -> bool:
    """Photo files on disk read through the recipe's pipeline by a pretrained backbone."""
    train = survey.train
    on_disk = getattr(train, "paths", None) and getattr(train, "images", None) is None \
        and not hasattr(train, "sample_images")
    return bool(on_disk) and cfg.data.pipeline == "recipe" and recipe.uses_pretrained_weights(cfg)


def measures_view_size(cfg: Any, survey: Any, model_choices: Mapping[str, tuple[Any, str]]) -> bool:
    """Whether the view size is measured: photo files on disk whose view and training crop the recipe chose
    (neither set by the user), read through the recipe's pipeline by a pretrained backbone."""
    return _photo_files(cfg, survey) and "data.image_size" in model_choices and "data.crop_size" in model_choices \
        and model_choices["data.image_size"][0] == recipe.PHOTO_EVAL_SIZES[0]


def measures_pooling(cfg: Any, survey: Any, model: nn.Module, model_choices: Mapping[str, tuple[Any, str]]) -> bool:
    """Whether pooling and the mirror average are measured: photo files, a pretrained Embedder, and
    at least one of ``model.pooling`` / ``model.flip_average`` left to the recipe."""
    return _photo_files(cfg, survey) and pooling_choice.is_embedder(model) \
        and ("model.pooling" in model_choices or "model.flip_average" in model_choices)


def validation_split(cfg: Any, survey: Any, profile: recipe.DataProfile):
    """The validation classes :func:`~dmlkit.recipe.planner.apply_recipe` will hold out of ``survey.train``
    (same function, fraction and seed), ``survey.val`` when the data has one (a fold), or None (no validation
    classes; ``protocol.val_fraction`` holds out images of the training classes instead)."""
    if survey.val is not None:
        return survey.val
    p = cfg.protocol
    if p.val_fraction > 0:
        return None
    fraction = p.val_class_fraction
    if fraction is None and p.fold is None:
        fraction = round(recipe.val_class_fraction_for(profile, recipe.uses_pretrained_weights(cfg)), 4)
    if not fraction:
        return None
    return hold_out_classes(survey.train, fraction, p.seed)[1]


def measure_view_size(cfg: Any, survey: Any, model: nn.Module, model_choices: Mapping[str, tuple[Any, str]], *,
                      device: torch.device, progress: Callable[[str], None] | None = None,
                      afford: Callable[[str, float], bool] | None = None) -> dict[str, tuple[Any, str]]:
    """``data.image_size`` and ``data.crop_size`` measured on the validation classes with the untrained ``model``
    (small photos), and ``model.pooling`` / ``model.flip_average`` (photos), as
    ``{field: (value, reason)}`` written into ``cfg`` (and the pooling and mirror into ``model``); ``{}`` when the
    recipe's rules stand.

    Runs between building the model and decoding the splits (``survey`` is
    :func:`~dmlkit.recipe.survey.survey_data`); the random state is left as it was. The reasons
    hold the measured tables (validation MAP@R, seconds) and the decisions. ``progress`` is told before the
    embedding starts (it takes a while on a CPU). ``afford(what, seconds)`` (the plan's measuring allowance) is
    asked before embedding what was not embedded already (the backbone choice's comparison is reused at no cost):
    when it refuses, the recipe's rules stand, said in the reasons.
    """
    sizing = measures_view_size(cfg, survey, model_choices)
    pooling = measures_pooling(cfg, survey, model, model_choices)
    if not (sizing or pooling):
        return {}
    profile = recipe.profile_split(survey.train)
    side = min(profile.height, profile.width)
    sizes = candidate_sizes(side) if sizing and 0 < side < MEASURED_BELOW else []
    if len(sizes) < 2:
        sizes = [int(cfg.data.image_size or model_choices.get("data.image_size", (recipe.PHOTO_TRAIN_SIZE,))[0])]
        sizing = False
    val = validation_split(cfg, survey, profile) if sizing or pooling else None
    if val is None:
        return {}
    configurations = pooling_choice.candidates(model_choices, model) if pooling else None
    fresh = [size for size in sizes if _score_key(cfg, val, size, configurations, device) not in _SCORED]
    if fresh and afford is not None and not afford("the view size and pooling", 0.0):
        return _rules_stand(cfg, model_choices, sizing, pooling)
    if progress is not None:
        progress(f"plan: measuring the view size{' and pooling' if pooling else ''} on the validation classes "
                 f"({', '.join(map(str, sizes))} px) ...")
    state = rng_state()
    try:
        table = distributed.broadcast_object(
            measure_sizes(cfg, model, val, sizes, device=device, configurations=configurations)
            if distributed.is_main_process() else None)
    finally:
        set_rng_state(state)
        model.train(model.training)  # the measurement ran the shared trunk in eval mode
    best = {s: m.per_query[pooling_choice.best_configuration(m.per_query)] for s, m in table.items()}
    size = choose_view_size(best)[0] if sizing else sizes[0]
    queries = int(next(iter(best.values())).numel())
    where = f"{queries} images of {len(val.class_names)} validation classes"
    choices: dict[str, tuple[Any, str]] = {}
    if sizing:
        decision = choose_view_size(best)[1]
        measured = ", ".join(f"{s}: {float(best[s].nanmean()):.4f} ({table[s].seconds:.1f} s)" if s in table
                             else f"{s}: not measured" for s in sizes)
        choices["data.image_size"] = (size, f"median image {profile.height}x{profile.width}, below {MEASURED_BELOW} px: "
                                            f"view sizes measured with the untrained backbone on {where}, MAP@R (time) "
                                            f"{measured}; {decision}")
        choices["data.crop_size"] = (size, f"small photos: random crops at the {size}-px view")
    if pooling:
        per_config = table[size].per_query
        (pool, flip), decision = pooling_choice.choose_pooling(per_config, table[size].labels)
        scores = ", ".join(f"{pooling_choice.describe(c)} {float(ap.nanmean()):.4f}" for c, ap in per_config.items())
        reason = f"measured at {size} px with the untrained backbone on {where}: {scores}; {decision}"
        if "model.pooling" in model_choices:
            choices["model.pooling"] = (pool, reason)
        if "model.flip_average" in model_choices:
            choices["model.flip_average"] = (flip, f"{'kept' if flip else 'dropped'}: see model.pooling"
                                             if "model.pooling" in model_choices else reason)
        pooling_choice.apply_to_model(model, (pool, flip))
        if cfg.optimizer.lr is None:  # how far the untrained features are from the classes sets the step
            choices["optimizer.lr"] = recipe.pretrained_lr_choice(pooling_choice.mean_ap(per_config[(pool, flip)]),
                                                                  where)
    recipe.apply(cfg, choices)
    return choices


class Measured(NamedTuple):
    """One view size's measurement: per-query AP@R of each configuration, seconds, the queries' labels."""

    per_query: dict[Any, torch.Tensor]
    seconds: float
    labels: torch.Tensor


def measure_sizes(cfg: Any, model: nn.Module, val, sizes: list[int], *, device: torch.device,
                  configurations: tuple[tuple[str, ...], tuple[bool, ...]] | None = None) -> dict[int, Measured]:
    """``{size: ({configuration: per-query AP@R}, seconds)}``, measured from the largest size down until the
    size's best configuration is not :func:`tolerated` beside the best so far (the smaller ones are not measured).

    ``val``'s images (at most :data:`MEASURED_IMAGES`) are decoded once, then cut to each size's
    evaluation view, normalised as the model's preprocessing asks (:func:`dmlkit.data.splits.query_split`:
    exactly as the decoded evaluation splits) and embedded on ``device`` under the run's autocast, through
    the inference copy. ``configurations`` (poolings, mirror settings; an Embedder ``model`` only): every
    pairing is scored from one trunk pass over the image and its mirror
    (:class:`~dmlkit.recipe.pooling_choice.PooledViews`); None: ``model`` as it is, under the key None.
    """
    mode = getattr(val, "mode", None) or "RGB"
    images, labels = _decoded(val, mode, cfg.data.skip_bad_images)
    model = model.to(device)
    preprocessing = getattr(model, "pretrained_cfg", None)
    precision = cfg.train.mixed_precision
    if precision == "auto":  # as the recipe resolves it later
        precision = "bf16" if native_bf16(device) else "none"
    probe = None if configurations is None else pooling_choice.PooledViews(model.trunk, configurations[0])
    clock = device_clock(device)  # wall seconds once the device's queued work is done
    out: dict[int, Measured] = {}
    best: dict[int, torch.Tensor] = {}
    for size in sorted(sizes, reverse=True):
        # the same backbone, images, size and poolings measured before (backbone by budget's comparison): reused
        key = _score_key(cfg, val, size, configurations, device)
        if key not in _SCORED:
            start = clock()
            split = view_split(images, size, cfg.data.name, preprocessing, mode)
            embedded, _ = embed_dataset(probe if probe is not None else model, split, cfg.eval.batch_size, 0,
                                        autocast_dtype(precision))
            per_config = {None: embedded} if probe is None else pooling_choice.embeddings_by_configuration(
                model, embedded, *configurations)
            scored = {c: map_at_r_per_query(e, labels, backend=cfg.eval.backend) for c, e in per_config.items()}
            while len(_SCORED) >= KEPT_SCORES:  # the oldest out: a plan reads again only what it just measured
                del _SCORED[next(iter(_SCORED))]
            _SCORED[key] = Measured(scored, clock() - start, labels)
        out[size] = _SCORED[key]
        scored = out[size].per_query
        best[size] = scored[pooling_choice.best_configuration(scored)]
        if not tolerated(best[size], best[best_size(best)])[0]:
            break  # smaller views are taken to lose too: their time is saved
    return dict(sorted(out.items()))


def _score_key(cfg: Any, val, size: int, configurations, device: torch.device) -> tuple:
    """What a view size's scores depend on: the backbone, the size, the images, the poolings, precision, device."""
    precision = cfg.train.mixed_precision
    if precision == "auto":  # as the recipe resolves it later
        precision = "bf16" if native_bf16(device) else "none"
    return (cfg.model.name, size, _images_key(val), configurations, precision, str(device), cfg.eval.backend,
            cfg.data.name)


def _rules_stand(cfg: Any, model_choices: Mapping[str, tuple[Any, str]], sizing: bool, pooling: bool
                 ) -> dict[str, tuple[Any, str]]:
    """The recipe's rules for the view size and pooling, their reasons saying that they were not measured."""
    fields = (("data.image_size", "data.crop_size") if sizing else ()) + \
        (("model.pooling", "model.flip_average") if pooling else ())
    why = "not measured: the plan's measuring allowance is spent"
    return {field: (model_choices[field][0], f"{model_choices[field][1]}; {why}") for field in fields
            if field in model_choices}


def view_split(images: list, size: int, data_name: str, preprocessing: Mapping[str, Any] | None, mode: str = "RGB"):
    """Decoded photos (PIL) as a split of their ``size``-px evaluation views, normalised for the model, exactly as
    :func:`~dmlkit.engine.splits.build_splits` decodes the evaluation splits of photos at ``data.image_size=size``
    (:func:`dmlkit.data.splits.query_split` on the view the run records; labels -1)."""
    from dmlkit.data.splits import query_split

    interpolation = str((preprocessing or {}).get("interpolation", "bilinear"))
    view = {"in_memory": True, "view": "photo", "image_size": size, "crop_size": size, "size": [size, size],
            "interpolation": interpolation, "pipeline": "recipe", "resize": "pil", "mode": mode}
    return query_split(images, data_name, view, preprocessing)


#: The last view sizes measured (keyed by backbone, size, images, poolings, precision, device): a plan that compared
#: backbones on the validation classes measures the chosen one's view again at no cost.
_SCORED: dict[tuple, Measured] = {}

#: Measured views kept in :data:`_SCORED` (one per candidate backbone, and a spare).
KEPT_SCORES = 4

#: The validation images decoded last (keyed by their files): decoded once per plan.
_DECODED: dict[tuple, tuple[list, torch.Tensor]] = {}


def _images_key(dataset) -> str:
    """The files and labels of a split of image files (what its decoded images depend on)."""
    digest = hashlib.sha256("\n".join(map(str, dataset.paths)).encode())
    digest.update(dataset.labels.numpy().tobytes())
    return digest.hexdigest()[:16]


def _decoded(dataset, mode: str, skip_bad_images: bool) -> tuple[list, torch.Tensor]:
    """:func:`_decode` of :data:`MEASURED_IMAGES` of ``dataset``'s files, reused while the files are the same."""
    key = (_images_key(dataset), mode, skip_bad_images)
    if key not in _DECODED:
        _DECODED.clear()
        _DECODED[key] = _decode(dataset, mode, MEASURED_IMAGES, skip_bad_images)
    return _DECODED[key]


def _decode(dataset, mode: str, count: int, skip_bad_images: bool) -> tuple[list, torch.Tensor]:
    """Up to ``count`` of ``dataset``'s image files (the first of each class, an equal share) decoded, and their labels."""
    from dmlkit.data.base import decode_image
    from dmlkit.exceptions import DataError

    labels = dataset.labels
    classes = labels.unique()
    share = max(2, count // max(1, len(classes)))
    rows = torch.cat([(labels == c).nonzero().flatten()[:share] for c in classes]).sort().values
    images, kept = [], []
    for row in rows.tolist():
        try:
            images.append(decode_image(dataset.paths[row], mode, f"item {row} of the validation classes"))
        except DataError:
            if not skip_bad_images:
                raise
            continue
        kept.append(row)
    return images, labels[torch.tensor(kept, dtype=torch.int64)]
