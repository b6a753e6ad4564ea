"""Validations embed with fewer shifts than the test split (``eval.val_shift_average``), and the plans count it."""

from __future__ import annotations

import json

import pytest
import torch

from dmlkit.cli.main import main
from dmlkit.engine.checkpoint_files import load_checkpoint
from dmlkit.evaluation.retrieval import map_at_r_per_query
from dmlkit.models import Embedder, EmbedderEnsemble, create_model, shift_radius
from dmlkit.recipe import Trainer, glyph_plan
from dmlkit.recipe.glyph_plan import GlyphCosts, plan_glyphs
from dmlkit.recipe.time_budget import TimeBudget


def radii(model: torch.nn.Module) -> list[int]:
    return [m.shift_average for m in model.modules() if isinstance(m, Embedder)]


def test_shift_radius_sets_every_member_and_restores_them_even_after_an_error():
    members = [create_model("small_cnn", embedding_size=8, shift_average=2, width=4)
               for _ in range(3)]
    ensemble = EmbedderEnsemble(members)
    with shift_radius(ensemble, 1):
        assert radii(ensemble) == [1, 1, 1]
    assert radii(ensemble) == [2, 2, 2]
    with pytest.raises(RuntimeError), shift_radius(ensemble, 0):
        assert radii(ensemble) == [0, 0, 0]
        raise RuntimeError("validation failed")
    assert radii(ensemble) == [2, 2, 2]
    with shift_radius(ensemble, None):  # not set: the model's own
        assert radii(ensemble) == [2, 2, 2]


def test_a_smaller_radius_embeds_as_the_shifts_written_out():
    model = create_model("small_cnn", embedding_size=8, shift_average=2, width=4).eval()
    x = torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1), mode="replicate")
    with torch.no_grad():
        model.shift_average = 0
        views = [model(padded[:, :, 1 + dy:29 + dy, 1 + dx:29 + dx]) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
        model.shift_average = 2
        want = torch.nn.functional.normalize(torch.stack(views).mean(0), dim=1)
        with shift_radius(model, 1):
            got = model(x)
        assert torch.allclose(got, want, atol=1e-6)
        assert not torch.allclose(model(x), want, atol=1e-4)  # the model's own 25 shifts differ


def test_the_recipe_validates_over_one_pixel_where_the_model_averages_over_two():
    from tests.unit.recipe.test_rules import choices_for, glyphs

    got = choices_for(glyphs(200, 20))
    assert got["model.shift_average"] == 2 and got["eval.val_shift_average"] == 1
    assert "eval.val_shift_average" not in choices_for(glyphs(5, 180, size=8))  # no shifts: validations as the test
    assert "eval.val_shift_average" not in choices_for(glyphs(200, 20), **{"model.shift_average": 1})
    assert "eval.val_shift_average" not in choices_for(glyphs(200, 20), **{"eval.val_shift_average": 2})
    assert choices_for(glyphs(200, 20), **{"model.shift_average": 3})["eval.val_shift_average"] == 1


def test_validations_embed_at_their_radius_and_the_test_split_at_the_models(tmp_path, tiny_config, monkeypatch):
    from dmlkit.engine.training import selection

    seen = []
    embed = selection.embed_dataset

    def spy(model, *args, **kwargs):
        seen.append(sorted(set(radii(model))))
        return embed(model, *args, **kwargs)

    monkeypatch.setattr(selection, "embed_dataset", spy)
    cfg = tiny_config("model.shift_average=2", "eval.val_shift_average=1", "protocol.val_fraction=0.2",
                      "train.eval_every=2", "train.max_steps=4")
    trainer = Trainer(cfg, tmp_path / "run", echo=lambda _: None)
    trainer.fit()
    assert seen == [[1], [1], [2]]  # two validations, then the test split
    assert radii(trainer.model) == [2]
    # the logged validation is the radius-1 embedding's: re-embed the validation split with the kept weights
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    best = max((r for r in log if r.get("split") == "val"), key=lambda r: r["map_at_r"])
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "best.pt")
    trainer.model.load_state_dict(state["model"])
    with shift_radius(trainer.model, 1):
        emb, labels = embed(trainer.model, trainer.splits.val)
    assert map_at_r_per_query(emb, labels).mean().item() == pytest.approx(best["map_at_r"], abs=1e-6)
    # and `dmlkit evaluate --split val` reproduces it (the run's own validation radius)
    assert main(["evaluate", str(tmp_path / "run"), "--split", "val"]) == 0
    record = json.loads(next((tmp_path / "run" / "evaluations").glob("*-val.json")).read_text())
    assert record["map_at_r"] == pytest.approx(best["map_at_r"], abs=1e-6)


def test_the_trainer_prices_a_validation_image_at_its_views_and_a_test_image_at_the_models(tmp_path, tiny_config):
    cfg = tiny_config("model.shift_average=2", "eval.val_shift_average=1", "protocol.val_fraction=0.2")
    trainer = Trainer(cfg, tmp_path / "run", echo=lambda _: None)
    num_val, num_test = len(trainer.splits.val), len(trainer.splits.test)
    trainer.eval_seconds = [0.9]  # one validation measured: 9 passes an image
    speeds = TimeBudget.of(trainer).measured_speeds(trainer, 0.1, has_val=True)
    assert speeds.eval_seconds == pytest.approx(0.9)
    assert speeds.test_seconds == pytest.approx(0.9 / (num_val * 9) * num_test * 25)


def test_the_glyph_plan_prices_validations_at_their_views():
    costs = GlyphCosts(step=0.010, embed=0.0025, views=25, val_views=9)  # 0.1 ms a pass
    assert costs.val_embed == pytest.approx(0.0009)
    plan = plan_glyphs(time_budget=80.0, spent=5.0, steps=1249, members=3, evaluations=4, val_images=280,
                       test_images=1360, costs=costs)
    passes = 3 * (280 * 4 * 9 + 1360 * 25)  # every member: four validations at 9 passes, the test at 25
    assert plan.seconds == pytest.approx(5.0 + 1249 * 3 * 0.010 + passes * 1e-4)
    same = plan_glyphs(time_budget=80.0, spent=5.0, steps=1249, members=3, evaluations=4, val_images=280,
                       test_images=1360, costs=GlyphCosts(step=0.010, embed=0.0025, views=25))
    assert same.seconds - plan.seconds == pytest.approx(3 * 280 * 4 * 16 * 1e-4)


def test_the_glyph_plan_is_told_the_validation_views(monkeypatch, tiny_config):
    from dmlkit.recipe import prepare_run

    got = []
    measure = glyph_plan.plan_glyphs

    def spy(**kwargs):
        got.append(kwargs["costs"])
        return measure(**kwargs)

    monkeypatch.setattr(glyph_plan, "plan_glyphs", spy)
    prepare_run(tiny_config("train.max_steps=null", "train.eval_every=null", "model.shift_average=2",
                            "protocol.val_fraction=0.2"), echo=lambda _: None)
    [costs] = got
    assert (costs.views, costs.val_views) == (25, 9)  # the recipe chose eval.val_shift_average = 1
