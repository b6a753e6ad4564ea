"""Verification metrics against a float64 loop reference over sorted pair scores, and sklearn's ROC AUC."""

from __future__ import annotations

import math

import pytest
import torch
from sklearn.metrics import roc_auc_score

from dmlkit.evaluation import threshold_at_fmr, verification_metrics
from dmlkit.evaluation.verification import fmr_key, pair_scores
from dmlkit.exceptions import DataError, InvalidParameterError


def loop_pairs(embeddings, labels):
    """Every pair i < j: (cosine similarity in float64, same label), one pair at a time."""
    rows = [[float(v) for v in row] for row in embeddings.double()]
    norms = [math.sqrt(sum(v * v for v in row)) for row in rows]
    out = []
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            dot = sum(a * b for a, b in zip(rows[i], rows[j]))
            out.append((dot / (norms[i] * norms[j]), int(labels[i]) == int(labels[j])))
    return out


def reference(pairs, fmrs):
    """The definitions, transcribed: thresholds = sorted distinct scores plus one above the largest;
    a pair matches when score >= t; FMR / FNMR counted pair by pair."""
    genuine = [s for s, g in pairs if g]
    impostor = [s for s, g in pairs if not g]
    candidates = sorted({s for s, _ in pairs}) + [math.nextafter(max(s for s, _ in pairs), math.inf)]

    def fmr_at(t):
        return sum(1 for s in impostor if s >= t) / len(impostor)

    def fnmr_at(t):
        return sum(1 for s in genuine if s < t) / len(genuine)

    wins = 0.0
    for sg in genuine:
        for si in impostor:
            wins += 1.0 if sg > si else 0.5 if sg == si else 0.0
    out = {
        "roc_auc": wins / (len(genuine) * len(impostor)),
        "eer": min(max(fmr_at(t), fnmr_at(t)) for t in candidates),
    }
    for f in fmrs:
        t = next(t for t in candidates if fmr_at(t) <= f)  # ascending: the smallest admissible threshold
        out[f"threshold_at_fmr_{fmr_key(f)}"] = t
        out[f"fnmr_at_fmr_{fmr_key(f)}"] = fnmr_at(t)
    out["num_genuine_pairs"], out["num_impostor_pairs"] = len(genuine), len(impostor)
    return out


def random_data(n=70, dim=6, classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    return torch.randn(n, dim, generator=g, dtype=torch.float64) + 0.8 * torch.eye(classes, dim, dtype=torch.float64)[labels], labels


def tied_data(n=60, dim=4, seed=1):
    """Rows are +-(scaled) basis vectors: every score is exactly -1, 0 or 1, so almost all pairs tie."""
    g = torch.Generator().manual_seed(seed)
    axis = torch.randint(0, dim, (n,), generator=g)
    sign = torch.randint(0, 2, (n,), generator=g) * 2 - 1
    scale = torch.randint(1, 4, (n,), generator=g).double()
    x = torch.eye(dim, dtype=torch.float64)[axis] * (sign * scale).unsqueeze(1)
    labels = torch.where(torch.rand(n, generator=g) < 0.7, axis, torch.randint(0, dim, (n,), generator=g))
    return x, labels


FMRS = (1e-1, 1e-2, 1e-3)


@pytest.mark.parametrize("data", [random_data, tied_data, lambda: random_data(n=40, classes=2, seed=3)])
def test_equals_the_float64_loop_reference(data):
    x, y = data()
    pairs = loop_pairs(x, y)
    expected = reference(pairs, FMRS)
    got = verification_metrics(x, y, fmrs=FMRS)
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key
    assert got["roc_auc"] == pytest.approx(roc_auc_score([g for _, g in pairs], [s for s, _ in pairs]), abs=1e-12)
    for f in FMRS:
        assert threshold_at_fmr(x, y, f) == pytest.approx(expected[f"threshold_at_fmr_{fmr_key(f)}"], abs=1e-12)


def test_ties_move_together_at_the_threshold():
    x, y = tied_data()
    scores, genuine = pair_scores(x, y)
    assert set(scores.tolist()) == {-1.0, 0.0, 1.0}
    for f in (0.5, 0.05, 1e-3):
        t = threshold_at_fmr(x, y, f)
        matched_impostors = int(((scores >= t) & ~genuine).sum())
        assert matched_impostors / int((~genuine).sum()) <= f
        assert t in (-1.0, 0.0, 1.0) or t == math.nextafter(1.0, math.inf)


def test_separated_classes_are_perfect_and_one_class_has_no_impostors():
    labels = torch.arange(4).repeat_interleave(5)
    x = torch.eye(4, dtype=torch.float64)[labels] + 1e-3 * torch.randn(20, 4, dtype=torch.float64)
    got = verification_metrics(x, labels)
    assert got["roc_auc"] == 1.0 and got["eer"] == 0.0 and got["fnmr_at_fmr_1e-3"] == 0.0
    same = verification_metrics(x, torch.zeros(20, dtype=torch.int64))
    assert same["num_impostor_pairs"] == 0 and math.isnan(same["roc_auc"]) and math.isnan(same["eer"])
    with pytest.raises(DataError, match="impostor"):
        threshold_at_fmr(x, torch.zeros(20, dtype=torch.int64), 1e-2)


def test_large_sets_are_sampled_reproducibly_keeping_every_genuine_pair():
    x, y = random_data(n=300, classes=30, seed=5)
    exact = verification_metrics(x, y)
    genuine_pairs = exact["num_genuine_pairs"]
    sampled = verification_metrics(x, y, max_pairs=20_000, seed=7)
    assert sampled == verification_metrics(x, y, max_pairs=20_000, seed=7)
    assert sampled != verification_metrics(x, y, max_pairs=20_000, seed=8)
    assert sampled["num_genuine_pairs"] == genuine_pairs < 10_000
    assert sampled["num_genuine_pairs"] + sampled["num_impostor_pairs"] == 20_000
    assert sampled["roc_auc"] == pytest.approx(exact["roc_auc"], abs=0.01)
    assert sampled["eer"] == pytest.approx(exact["eer"], abs=0.02)
    # a budget below the genuine count samples genuine pairs too; they stay genuine
    scores, genuine = pair_scores(x, y, max_pairs=2 * 500, seed=0)
    assert len(scores) == 1000 and int(genuine.sum()) == 500
    assert torch.all(scores <= 1 + 1e-12)


def test_float32_embeddings_and_bad_inputs():
    x, y = random_data()
    got = verification_metrics(x.float(), y)
    assert got["roc_auc"] == pytest.approx(verification_metrics(x, y)["roc_auc"], abs=1e-4)
    with pytest.raises(InvalidParameterError, match="'fmr' parameter of verification_metrics"):
        verification_metrics(x, y, fmrs=(0.0,))
    with pytest.raises(InvalidParameterError, match="'max_pairs' parameter"):
        verification_metrics(x, y, max_pairs=1)
    with pytest.raises(DataError, match="NaN"):
        verification_metrics(torch.full((4, 2), float("nan")), torch.arange(4))
    with pytest.raises(DataError, match="two samples"):
        verification_metrics(x[:1], y[:1])
    assert fmr_key(1e-3) == "1e-3" and fmr_key(0.005) == "5e-3" and fmr_key(0.015) == "1.5e-2"


def test_sampled_pairs_score_the_same_from_gram_blocks_or_gathered_rows(monkeypatch):
    from dmlkit.evaluation import verification

    x, y = random_data(n=500, classes=40, seed=2)
    blocks = verification_metrics(x, y, max_pairs=20_000, seed=3)
    monkeypatch.setattr(verification, "_GRAM_ROWS", 10)  # force the gathered-rows path
    assert verification_metrics(x, y, max_pairs=20_000, seed=3) == blocks
    first, second = torch.tensor([0, 499, 7]), torch.tensor([1, 3, 7])
    xn = torch.nn.functional.normalize(x, dim=1)
    want = [sum(float(a) * float(b) for a, b in zip(xn[i], xn[j])) for i, j in zip(first, second)]
    assert verification._scores_of(xn, first, second).tolist() == pytest.approx(want, abs=1e-12)
