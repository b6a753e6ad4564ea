"""View size from the image size: small photos are viewed at the smallest size that measures as well
as the best on the validation classes, with the untrained pretrained backbone; larger photos keep the recipe's rule."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from dmlkit.config import load_config
from dmlkit.data.base import decode_image
from dmlkit.engine.model import build_model
from dmlkit.engine.splits import build_splits, hold_out_classes
from dmlkit.evaluation.retrieval import paired_gain
from dmlkit.recipe import Trainer
from dmlkit.recipe import planner as recipe_plan
from dmlkit.recipe.survey import survey_data
from dmlkit.recipe.view_size import (
    TOLERATED_ERRORS,
    candidate_sizes,
    choose_view_size,
    measure_sizes,
    validation_split,
    view_split,
)

# ----------------------------------------------------------------------------- the pure rule


def test_candidates_run_from_the_smallest_multiple_of_32_holding_the_image_to_224():
    assert candidate_sizes(84) == [96, 128, 160, 224]
    assert candidate_sizes(96) == [96, 128, 160, 224]
    assert candidate_sizes(100) == [128, 160, 224]
    assert candidate_sizes(170) == [192, 224]
    assert candidate_sizes(200) == [224]


def scores(base: torch.Tensor, shifts: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    return {size: (base + shift).double() for size, shift in shifts.items()}


def test_a_smaller_size_within_one_standard_error_of_the_best_wins():
    g = torch.Generator().manual_seed(0)
    base = torch.rand(200, generator=g, dtype=torch.float64) * 0.5
    noise = torch.randn(200, generator=g, dtype=torch.float64) * 0.05
    per_query = {96: base + noise - 0.002, 160: base + 0.004 * torch.randn(200, generator=g, dtype=torch.float64),
                 224: base.clone()}
    gain, error = paired_gain(per_query[96], per_query[224])
    assert -TOLERATED_ERRORS * error < gain < 0  # worse than the best, but within one standard error
    size, reason = choose_view_size(per_query)
    assert size == 96 and "within" in reason and "224 px" in reason


def test_a_smaller_size_worse_by_more_than_one_standard_error_loses():
    g = torch.Generator().manual_seed(1)
    base = torch.rand(200, generator=g, dtype=torch.float64) * 0.5
    per_query = {96: base - 0.05 + 0.01 * torch.randn(200, generator=g, dtype=torch.float64),
                 128: base - 0.002 + 0.05 * torch.randn(200, generator=g, dtype=torch.float64), 224: base.clone()}
    worse, error = paired_gain(per_query[96], per_query[224])
    assert worse < -TOLERATED_ERRORS * error
    assert paired_gain(per_query[128], per_query[224])[0] >= -paired_gain(per_query[128], per_query[224])[1]
    size, _ = choose_view_size(per_query)
    assert size == 128  # 96 lost; 128 is within one standard error of 224


def test_the_best_size_wins_when_every_smaller_one_is_significantly_worse():
    base = torch.linspace(0.2, 0.8, 50, dtype=torch.float64)
    size, reason = choose_view_size(scores(base, {96: torch.full((50,), -0.1), 128: torch.full((50,), -0.01),
                                                  224: torch.zeros(50)}))
    assert size == 224 and reason == "224 px has the best validation MAP@R"


def test_ties_go_to_the_smallest_size():
    base = torch.linspace(0.2, 0.8, 50, dtype=torch.float64)
    size, reason = choose_view_size({224: base.clone(), 128: base.clone(), 96: base.clone()})
    assert size == 96 and reason == "96 px has the best validation MAP@R"  # the smallest of equal maxima is the best


def test_a_single_candidate_is_chosen():
    assert choose_view_size({224: torch.tensor([0.5, 0.25], dtype=torch.float64)}) == (224, "224 px, the only candidate")
    with pytest.raises(ValueError):
        choose_view_size({})


def test_queries_without_a_true_reference_are_left_out_of_the_comparison():
    base = torch.tensor([0.5, 0.6, float("nan"), 0.7], dtype=torch.float64)
    size, _ = choose_view_size({96: base - 0.2, 224: base})  # every scored query worse by the same 0.2: SE 0
    assert size == 224


# ----------------------------------------------------------------------------- photo folders


def write_photos(root: Path, side: int, classes: int = 6, per_class: int = 5) -> Path:
    """``classes`` folders of ``per_class`` JPEG photos ``side`` px a side, each class a colour cast over a grainy
    gradient (classes any view tells apart; the folder reader tests on a seeded random third of 6 classes, trains
    on the other 4, of which the recipe holds 2 out for validation)."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:side, :side] / side - 0.5
    for c in range(classes):
        colour = np.array([(c * 97) % 256, (c * 53 + 80) % 256, (c * 29 + 160) % 256], dtype=np.float64) / 255
        (root / f"class{c:02d}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            slope = rng.uniform(-1, 1, 2)
            light = 0.6 + 0.5 * (yy * slope[0] + xx * slope[1])[..., None] + rng.normal(0, 0.05, (side, side, 1))
            pixels = (255 * colour * light).clip(0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / f"class{c:02d}" / f"{i}.jpg", quality=90)
    return root


def photo_config(root: Path, *overrides: str):
    return load_config(preset="mnist-proxy-anchor", overrides=[
        "data.name=folder", f"data.root={root}", "train.max_steps=1", "train.progress=false",
        "eval.clustering=false", "eval.save_embeddings=false", "eval.batch_size=16", *overrides])


@pytest.fixture(scope="module")
def small_photos(tmp_path_factory) -> Path:
    return write_photos(tmp_path_factory.mktemp("small") / "photos", 84)


def test_the_measured_validation_classes_are_those_apply_recipe_holds_out(small_photos):
    cfg = photo_config(small_photos, "protocol.seed=3")
    survey = survey_data(cfg)
    recipe_plan.apply_model_recipe(cfg, survey, echo=lambda _: None)
    from dmlkit.recipe.rules import profile_split

    measured = validation_split(cfg, survey, profile_split(survey.train))
    assert cfg.protocol.val_class_fraction is None  # the measurement leaves the recipe's choice to apply_recipe
    splits = build_splits(cfg, nn.Identity(), survey)
    recipe_plan.apply_recipe(cfg, splits, echo=lambda _: None)
    assert sorted(measured.class_names) == sorted(splits.val.class_names) and len(measured.class_names) == 2
    assert sorted(measured.paths) == sorted(splits.val.paths)



def test_no_validation_classes_to_measure_on_when_images_of_the_training_classes_are_held_out(small_photos):
    from dmlkit.recipe.rules import profile_split

    cfg = photo_config(small_photos, "protocol.val_fraction=0.2")
    survey = survey_data(cfg)
    assert validation_split(cfg, survey, profile_split(survey.train)) is None
    cfg = photo_config(small_photos, "protocol.val_class_fraction=0.5", "protocol.seed=1")
    held = validation_split(cfg, survey, profile_split(survey.train))
    assert sorted(held.class_names) == sorted(hold_out_classes(survey.train, 0.5, 1)[1].class_names)

def test_small_photos_are_viewed_at_the_measured_size(small_photos, tmp_path):
    printed: list[str] = []
    cfg = photo_config(small_photos)
    trainer = Trainer(cfg, tmp_path / "run", echo=printed.append)
    assert cfg.data.image_size is None  # the given config is left as it was; the trainer's is finished
    cfg = trainer.cfg
    size = cfg.data.image_size
    assert size in (96, 128, 160, 224) and cfg.data.crop_size == size  # a measured view, cropped as viewed
    assert tuple(trainer.splits.val.images.shape[-2:]) == (size, size)  # decoded once, at the chosen view
    line = next(line for line in "\n".join(printed).splitlines() if "data.image_size" in line)
    scores = {int(s): float(v) for s, v in re.findall(r"(\d+): (\d\.\d+) \(", line)}
    assert scores[size] == max(scores.values())  # the view with the best validation MAP@R, not the backbone's input
    assert f"data.image_size = {size}" in line and "measured with the untrained backbone on 10 images of 2 validation" \
        in line
    for candidate in (96, 128, 160, 224):
        assert f"{candidate}: " in line  # the measured table: size: MAP@R (seconds)
    assert trainer.recipe.choices["data.image_size"][0] == size
    # the measurement saw the validation photos as the run's validation sees them: the same per-query AP@R
    from dmlkit.evaluation.retrieval import map_at_r_per_query
    from dmlkit.recipe.rules import profile_split

    survey = survey_data(cfg)
    measured = measure_sizes(cfg, trainer.model, validation_split(cfg, survey, profile_split(survey.train)), [size],
                             device=torch.device("cpu"))
    assert torch.allclose(measured[size][0][None], map_at_r_per_query(*trainer.embed(trainer.splits.val)), atol=1e-6)
    val = trainer.splits.val
    photos = [decode_image(path, "RGB", "a validation photo") for path in val.paths]
    views = view_split(photos, size, "folder", trainer.model.pretrained_cfg)
    assert torch.equal(views.images, val.images)  # the same pixels
    assert torch.equal(views.get_batch([0, 1])[0], val.get_batch([0, 1])[0])  # the same normalisation


def test_photos_of_224_px_and_more_keep_the_recipes_rule_unmeasured(tmp_path):
    root = write_photos(tmp_path / "photos", 300, classes=8, per_class=3)
    printed: list[str] = []
    cfg = photo_config(root)
    cfg = Trainer(cfg, tmp_path / "run", echo=printed.append).cfg
    assert cfg.data.image_size == 256 and cfg.data.crop_size == 224  # photo_eval_size: 300 px holds a 256 view
    assert "view sizes measured" not in "\n".join(printed)
    assert "model.pooling = avg  (measured at 256 px" in "\n".join(printed)  # pooling is measured at the recipe's view
    # the untrained embedding's validation MAP@R with that pooling sets the learning rate
    untrained = float(re.search(r"optimizer.lr = \S+  \(the untrained backbone's validation MAP@R on \d+ images of "
                                r"\d+ validation classes is (\d\.\d+)", "\n".join(printed)).group(1))
    assert cfg.optimizer.lr == (3e-5 if untrained < 0.65 else 1e-5)
    assert Trainer(photo_config(root, "optimizer.lr=2e-4"), tmp_path / "own", echo=printed.append).cfg.optimizer.lr \
        == 2e-4  # a rate set by hand is kept


def test_a_users_view_size_is_not_measured(small_photos, tmp_path):
    printed: list[str] = []
    cfg = photo_config(small_photos, "data.image_size=224")
    Trainer(cfg, tmp_path / "run", echo=printed.append)
    assert cfg.data.image_size == 224 and "view sizes measured" not in "\n".join(printed)


class SharpAboveOnly(nn.Module):
    """Embeds a photo by its colour at views of ``sharp_from`` px and more, by noise below (a stand-in backbone)."""

    def __init__(self, sharp_from: int):
        super().__init__()
        self.sharp_from = sharp_from
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] >= self.sharp_from:
            return x.mean(dim=(2, 3)) * self.scale
        return torch.randn(len(x), 3, generator=torch.Generator().manual_seed(x.shape[-1]))


def test_the_measurement_runs_down_from_224_and_stops_at_the_first_size_that_loses(small_photos):
    cfg = photo_config(small_photos, "train.mixed_precision=none")
    train = survey_data(cfg).train  # 4 classes of 5 photos, files not decoded
    measured = measure_sizes(cfg, SharpAboveOnly(160), train, [96, 128, 160, 224], device=torch.device("cpu"))
    assert list(measured) == [128, 160, 224]  # 128 lost against 224: 96 was not measured
    assert float(measured[224][0][None].mean()) == float(measured[160][0][None].mean()) == 1.0  # colours tell apart
    assert float(measured[128][0][None].mean()) < 0.9 and all(m.seconds >= 0 for m in measured.values())
    assert choose_view_size({s: ap[None] for s, (ap, _, _) in measured.items()})[0] == 160


def test_backbones_compared_untrained_are_not_embedded_again_for_the_view_size(small_photos, monkeypatch):
    """Backbone by budget scores each candidate on the validation classes; the view-size step reuses the
    chosen one's embeddings at that size instead of embedding them again."""
    from dmlkit.recipe import backbone_choice, pooling_choice, view_size
    from dmlkit.recipe.rules import profile_split

    cfg = photo_config(small_photos, "train.mixed_precision=none")
    survey = survey_data(cfg)
    choices = recipe_plan.apply_model_recipe(cfg, survey, echo=lambda _: None)
    size = cfg.data.image_size
    scores = backbone_choice.untrained_scores(cfg, survey, choices, torch.device("cpu"),
                                              ["efficientnet_lite0", "efficientnet_lite1"])
    assert list(scores) == ["efficientnet_lite0", "efficientnet_lite1"] and all(0 <= s <= 1 for s in scores.values())
    monkeypatch.setattr(view_size, "embed_dataset", lambda *args, **kwargs: pytest.fail("embedded again"))
    cfg.model.name = "efficientnet_lite0"
    model = build_model(cfg)
    val = validation_split(cfg, survey, profile_split(survey.train))
    measured = measure_sizes(cfg, model, val, [size], device=torch.device("cpu"),
                             configurations=pooling_choice.candidates(choices, model))[size]
    kept = pooling_choice.choose_pooling(measured.per_query, measured.labels)[0]
    assert float(measured.per_query[kept].nanmean()) == scores["efficientnet_lite0"]
