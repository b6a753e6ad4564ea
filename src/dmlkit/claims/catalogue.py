"""The arms and the claims: what each paper says, which trained arms test it, and how.

An :class:`Arm` is one training configuration (config sections of ``dmlkit.fit``: the loss with its
miner, ASAP's settings) in one setting (glyph settings: :mod:`dmlkit.claims.glyphs`; photo settings:
:mod:`dmlkit.claims.photos`); arms are shared between claims (the MS arm serves Proxy-Anchor's and
DRO's claims). A :class:`Claim` names the paper's table or figure, the metric, and its confirmatory
:class:`Comparison`\\ s, which are Holm-corrected together (and once more over all claims).

Tuned alike: every arm tunes the learning rate and exactly one method parameter of its own
(:attr:`Arm.tuned`, three values around the paper's) on the tuning classes
(:mod:`dmlkit.claims.runner`); a value chosen at a grid edge extends the grid until it is interior or
meets the arm's stated hard limit. The ``@paper`` arms keep the papers' values and tune only the
learning rate (the headline Proxy-Anchor claim is tested both ways).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

#: The learning-rate grid every glyph arm starts from (Adam-W, from scratch).
LEARNING_RATES = (3e-4, 1e-3, 3e-3)
#: The photo arms' grid (the pretrained backbone's rate; the head learns 10x, proxies 100x faster).
PHOTO_LEARNING_RATES = (3e-5, 1e-4, 3e-4)
#: Hard limits of the learning rate when a grid edge extends it.
LR_LIMITS = (1e-5, 3e-2)
#: The one rate every arm of a convergence claim also trains at (their curves compared at equal rates).
COMMON_LEARNING_RATE = 1e-3
#: The photo settings (:mod:`dmlkit.claims.photos`); the others are glyph settings (:mod:`dmlkit.claims.glyphs`).
PHOTO_SETTINGS = ("grocery", "grocery-coarse", "grocery-coarse-disjoint")


def learning_rates_for(setting: str, glyph_rates: tuple[float, ...] = LEARNING_RATES) -> tuple[float, ...]:
    """The learning-rate grid of a setting."""
    return PHOTO_LEARNING_RATES if setting in PHOTO_SETTINGS else glyph_rates

#: The embedding size of every glyph arm (ASAP's and EPS's 128-D).
EMBEDDING_SIZE = 128


@dataclass(frozen=True)
class Arm:
    """One trained configuration: ``loss`` and ``asap`` are ``dmlkit.fit`` config sections."""

    name: str
    setting: str
    description: str
    loss: dict
    asap: dict = field(default_factory=dict)
    normalization: str = "l2"
    #: The one method parameter tuned with the learning rate: ``{arg: (three values)}``; ``a+b`` sets two
    #: arguments to one value; ``pair_loss.neg_margin`` reaches into a nested loss's arguments.
    tuned: dict = field(default_factory=dict)
    #: Hard limits of the tuned parameter when a grid edge extends it: ``{arg: (low, high)}`` (default: > 0).
    limits: dict = field(default_factory=dict)
    #: Train at the point another arm chose instead of tuning (an ablation of that arm: only one thing differs).
    tuned_with: str | None = None
    #: Glyph steps as a multiple of the budget's cap (every arm of a claim has the same): ASAP's projections run
    #: "until convergence" (early stopping with patience 3 on validation MAP@R), which 300 steps of a CNN still
    #: improving never reach, so its claims train 4x longer for all their arms.
    steps_scale: int = 1
    #: The same for photo runs: the EPS photo arms, tuned to the lowest rates (training on coarse kinds costs
    #: fine retrieval), were still improving at the 400-step cap.
    photo_steps_scale: int = 1


@dataclass(frozen=True)
class Comparison:
    """``a`` against ``b`` on the claim's metric: ``superior`` (a beats b) or ``equivalent`` within ``margin``."""

    a: str
    b: str
    kind: str = "superior"
    margin: float | None = None


@dataclass(frozen=True)
class Claim:
    """A paper's claim and the comparisons that test it."""

    name: str
    paper: str
    source: str
    statement: str
    paper_numbers: str
    metric: str
    comparisons: tuple[Comparison, ...]
    #: A fixed validation MAP@R that convergence claims (``metric='steps_to_threshold'``) time the arms to.
    threshold: float | None = None
    #: Or, as the catalogue's claims do: each seed's step 0 plus this fraction of the smallest gain among the
    #: claim's arms in their tuning runs (a level every arm crosses mid-curve, fixed before any seed trains).
    threshold_fraction: float | None = None

    @property
    def arms(self) -> tuple[str, ...]:
        names: list[str] = []
        for c in self.comparisons:
            names += [n for n in (c.a, c.b) if n not in names]
        return tuple(names)


def _miner(name: str, **args) -> dict:
    return {"name": name, "args": args}


_TRIPLET = {"name": "triplet_margin", "args": {"margin": 0.2}}
_MS = {"name": "multi_similarity", "args": {"alpha": 2.0, "beta": 50.0, "base": 0.5}}
_MS_EPS = {"name": "multi_similarity", "args": {"alpha": 2.0, "beta": 50.0, "base": 1.0}}  # EPS Sec. 5.2.2
#: The EPS photo arms' cap, as a multiple of the photo cap (Arm.photo_steps_scale).
_EPS_PHOTO_SCALE = 2
_MARGIN = {"name": "margin", "args": {"margin": 0.2, "beta": 1.2, "learn_beta": True}}  # Wu et al., EPS Sec. 5.2.2
_DRO_BASE = {"base": "margin", "margin": 0.2, "threshold": 0.5}
#: DRO Sec. 4.2: K = 2B pairs (the batch holds B = 64 glyphs); TopK-PN splits K evenly.
_DRO_K = 128
_C2_PAIR = {"name": "contrastive", "args": {"distance": "euclidean", "pos_margin": 0.0, "neg_margin": 0.3841,
                                            "reduction": "sum"}}
#: ASAP Sec. 5 (Table 1 setting): K = 8 proxies a class re-drawn from b = 12 samples, lambda = 2e-4.
_ASAP_K, _ASAP_B = 8, 12
_C2_PROXY_LOSS = {"name": "proxy_pair", "args": {"pair_loss": _C2_PAIR, "reduction": "mean",
                                                 "proxies_per_class": _ASAP_K}}
#: The one-problem control: one projection that ends by early stopping after 8 validations without a gain (the
#: patience of every other glyph run), so that it trains to convergence, not to the cap.
_C2_ONE_PROBLEM = {"enabled": True, "proxies_per_class": _ASAP_K, "pool_size": _ASAP_B, "proximal_lambda": 0.0,
                   "max_projections": 1, "patience": 8}
_C2_ASAP = {"enabled": True, "proxies_per_class": _ASAP_K, "pool_size": _ASAP_B, "proximal_lambda": 2e-4,
            "patience": 3, "max_projections": 20, "projections_without_improvement": 3}

#: The tuned parameter of each method, three values around the paper's (or PML's default).
_ALPHA = {"alpha": (16.0, 32.0, 64.0)}
_NCA_SCALE = {"softmax_scale": (4.0, 8.0, 16.0)}  # the paper's Proxy-NCA is unscaled (1): the @paper arm
_NPAIRS_SCALE = {"scale": (4.0, 8.0, 16.0)}  # the paper's (and PML's) cosine logits are unscaled: 1
_MS_BETA = {"beta": (25.0, 50.0, 100.0)}
_MARGIN_GRID = {"margin": (0.1, 0.2, 0.4)}
_NEG_MARGIN = {"neg_margin": (0.5, 1.0, 2.0)}
_C2_MARGIN = {"pair_loss.neg_margin": (0.25, 0.3841, 0.6)}
_MARGIN_LIMIT = {"margin": (0.0125, 1.6)}  # hinges on unit vectors: distances live in [0, 2]


def _glyph_arms(setting: str, prefix: str = "") -> tuple[Arm, ...]:
    """The arms of the ``characters`` setting (``prefix`` names the arms of another setting)."""
    n = prefix
    return (
        Arm(f"{n}proxy-anchor", setting, "Proxy-Anchor, Eq. (4) (delta 0.1), alpha tuned",
            {"name": "proxy_anchor", "args": {"margin": 0.1, "alpha": 32.0}}, tuned=_ALPHA),
        Arm(f"{n}proxy-nca", setting, "Proxy-NCA, Eq. (4): positive proxy out of the denominator, scale tuned",
            {"name": "proxy_nca", "args": {"exclude_positive": True}}, tuned=_NCA_SCALE),
        Arm(f"{n}triplet-semihard", setting, "triplet loss with semi-hard mining, margin tuned",
            {**_TRIPLET, "miner": _miner("triplet_margin", margin=0.2, type_of_triplets="semihard")},
            tuned=_MARGIN_GRID, limits=_MARGIN_LIMIT),
        Arm(f"{n}lifted", setting, "lifted structure (Oh Song et al. 2016), negative margin tuned",
            {"name": "lifted_structure", "args": {"neg_margin": 1.0, "pos_margin": 0.0}}, tuned=_NEG_MARGIN),
        Arm(f"{n}npairs", setting, "N-pairs (Sohn 2016) on cosine logits, scale tuned",
            {"name": "npairs", "args": {}}, tuned=_NPAIRS_SCALE),
        Arm(f"{n}ms", setting, "multi-similarity loss with its miner (alpha 2, lambda 0.5, epsilon 0.1), beta tuned",
            {**_MS, "miner": _miner("multi_similarity", epsilon=0.1)}, tuned=_MS_BETA),
        Arm(f"{n}dro-all-pairs", setting, "margin loss averaged over every pair (DRO-TopK, K = every pair), margin tuned",
            {"name": "dro", "args": {"weighting": "top_k", **_DRO_BASE, "k": 1_000_000}},
            tuned=_MARGIN_GRID, limits=_MARGIN_LIMIT),
        Arm(f"{n}dro-topk-pn", setting, "DRO-TopK-PN, margin base (K/2 positive + K/2 negative pairs), K tuned",
            {"name": "dro", "args": {"weighting": "top_k_pn", **_DRO_BASE, "k_pos": _DRO_K // 2, "k_neg": _DRO_K // 2}},
            tuned={"k_pos+k_neg": (32, 64, 128)}, limits={"k_pos+k_neg": (4, 4096)}),
        Arm(f"{n}c2", setting, "C2 contrastive on the batch's pairs (margins 0 / 0.3841), bounded normalisation, "
            "negative margin tuned",
            {"name": "contrastive", "args": {"distance": "euclidean", "pos_margin": 0.0, "neg_margin": 0.3841}},
            normalization="bounded", steps_scale=4, tuned={"neg_margin": _C2_MARGIN["pair_loss.neg_margin"]}),
        Arm(f"{n}c2-asap", setting, "C2-ASAP: K = 8, b = 12, lambda 2e-4, a projection ends after 3 validations "
            "without a gain (the paper's early stopping), negative margin tuned",
            _C2_PROXY_LOSS, _C2_ASAP, normalization="bounded", steps_scale=4, tuned=_C2_MARGIN),
    )


ARMS: dict[str, Arm] = {arm.name: arm for arm in (
    # ------------------------------------------------------------------ characters: classes are characters
    *_glyph_arms("characters"),
    Arm("proxy-nca-half", "characters", "Proxy-NCA with half as many proxies as classes (static assignment)",
        {"name": "proxy_nca", "args": {"exclude_positive": True, "proxies_per_class": 0.5}}, tuned_with="proxy-nca"),
    Arm("lifted-generalized", "characters", "generalised lifted structure (log-sum-exp form, DRO Table 1), "
        "negative margin tuned",
        {"name": "generalized_lifted_structure", "args": {"neg_margin": 1.0, "pos_margin": 0.0}}, tuned=_NEG_MARGIN),
    Arm("dro-topk", "characters", "DRO-TopK, margin base (K = 2B = 128), K tuned",
        {"name": "dro", "args": {"weighting": "top_k", **_DRO_BASE, "k": _DRO_K}},
        tuned={"k": (64, 128, 256)}, limits={"k": (8, 8192)}),
    Arm("dro-kl", "characters", "DRO-KL, margin base (128 pairs sampled from p*), gamma tuned",
        {"name": "dro", "args": {"weighting": "kl", **_DRO_BASE, "gamma": 0.1, "sample": True, "num_samples": _DRO_K}},
        tuned={"gamma": (0.1, 0.3, 0.9)}),
    Arm("dro-kl-g", "characters", "DRO-KL-G, margin base (per-anchor positive and negative weights, Eq. (7)), "
        "gamma tuned (positives and negatives alike)",
        {"name": "dro", "args": {"weighting": "kl_grouped", **_DRO_BASE, "gamma_pos": 0.1, "gamma_neg": 0.1}},
        tuned={"gamma_pos+gamma_neg": (0.05, 0.1, 0.2)}),
    Arm("c2-proxy", "characters", "C2 against K = 8 learnt proxies a class, one problem (proxies start as ASAP's: "
        "k-center on sample embeddings), no alternation, negative margin tuned",
        _C2_PROXY_LOSS, _C2_ONE_PROBLEM, normalization="bounded", steps_scale=4, tuned=_C2_MARGIN),
    # the headline claim at the papers' own values: only the learning rate tuned
    Arm("proxy-anchor@paper", "characters", "Proxy-Anchor at the paper's alpha 32, delta 0.1",
        {"name": "proxy_anchor", "args": {"margin": 0.1, "alpha": 32.0}}),
    Arm("proxy-nca@paper", "characters", "Proxy-NCA as the paper states it: unscaled softmax (scale 1)",
        {"name": "proxy_nca", "args": {"exclude_positive": True, "softmax_scale": 1.0}}),
    Arm("ms@paper", "characters", "multi-similarity at the paper's alpha 2, beta 50, lambda 0.5",
        {**_MS, "miner": _miner("multi_similarity", epsilon=0.1)}),
    Arm("triplet-semihard@paper", "characters", "triplet semi-hard at margin 0.2 (FaceNet's, Proxy-NCA's baseline)",
        {**_TRIPLET, "miner": _miner("triplet_margin", margin=0.2, type_of_triplets="semihard")}),
    # ------------------------------------------------------------------ alphabets: trained on alphabet labels (EPS)
    *(arm for setting, p in (("alphabets", "eps-"), ("alphabets-disjoint", "eps-disjoint-")) for arm in (
        Arm(f"{p}base-triplet", setting, "triplet + semi-hard positives and negatives (EPS's baseline), margin tuned",
            {**_TRIPLET, "miner": _miner("triplet_margin", margin=0.2, type_of_triplets="semihard")},
            tuned=_MARGIN_GRID, limits=_MARGIN_LIMIT),
        Arm(f"{p}triplet", setting, "triplet: easy positive, semi-hard negatives, margin tuned",
            {**_TRIPLET, "miner": _miner("easy_positive", negative="semihard", margin=0.2)},
            tuned=_MARGIN_GRID, limits=_MARGIN_LIMIT),
    )),
    Arm("eps-base-margin", "alphabets", "margin loss with distance-weighted sampling, margin tuned",
        {**_MARGIN, "miner": _miner("distance_weighted", cutoff=0.5, nonzero_loss_cutoff=1.4)},
        tuned=_MARGIN_GRID, limits=_MARGIN_LIMIT),
    Arm("eps-margin", "alphabets", "margin loss: easy positive, distance-weighted negatives, margin tuned",
        {**_MARGIN, "miner": _miner("easy_positive", negative="distance_weighted")},
        tuned=_MARGIN_GRID, limits=_MARGIN_LIMIT),
    Arm("eps-base-ms", "alphabets", "MS loss with its miner (alpha 2, lambda 1), beta tuned",
        {**_MS_EPS, "miner": _miner("multi_similarity", epsilon=0.1)}, tuned=_MS_BETA),
    Arm("eps-ms", "alphabets", "MS loss: easy positive, MS negatives, beta tuned",
        {**_MS_EPS, "miner": _miner("easy_positive", negative="multi_similarity", epsilon=0.1)}, tuned=_MS_BETA),
    # ------------------------------------------------------------------ photos: the pretrained backbone fine-tuned
    *_glyph_arms("grocery", "grocery/"),
    Arm("grocery-coarse/eps-base-triplet", "grocery-coarse", "triplet + semi-hard mining, trained on coarse labels, "
        "margin tuned", {**_TRIPLET, "miner": _miner("triplet_margin", margin=0.2, type_of_triplets="semihard")},
        tuned=_MARGIN_GRID, limits=_MARGIN_LIMIT, photo_steps_scale=_EPS_PHOTO_SCALE),
    Arm("grocery-coarse/eps-triplet", "grocery-coarse", "triplet: easy positive, semi-hard negatives, trained on "
        "coarse labels, margin tuned", {**_TRIPLET, "miner": _miner("easy_positive", negative="semihard", margin=0.2)},
        tuned=_MARGIN_GRID, limits=_MARGIN_LIMIT, photo_steps_scale=_EPS_PHOTO_SCALE),
    # EPS on coarse kinds that no test product shares: the test products' kinds were never a training label
    Arm("grocery-coarse-disjoint/eps-base-triplet", "grocery-coarse-disjoint", "triplet + semi-hard mining, trained "
        "on coarse labels, tested on the products of other kinds, margin tuned",
        {**_TRIPLET, "miner": _miner("triplet_margin", margin=0.2, type_of_triplets="semihard")},
        tuned=_MARGIN_GRID, limits=_MARGIN_LIMIT, photo_steps_scale=_EPS_PHOTO_SCALE),
    Arm("grocery-coarse-disjoint/eps-triplet", "grocery-coarse-disjoint", "triplet: easy positive, semi-hard "
        "negatives, trained on coarse labels, tested on the products of other kinds, margin tuned",
        {**_TRIPLET, "miner": _miner("easy_positive", negative="semihard", margin=0.2)},
        tuned=_MARGIN_GRID, limits=_MARGIN_LIMIT, photo_steps_scale=_EPS_PHOTO_SCALE),
)}

_EPS_PAIRS = tuple(Comparison(f"eps-{k}", f"eps-base-{k}") for k in ("triplet", "margin", "ms"))
_PA_NUMBERS = ("CUB R@1 (BN-Inception, 64-D): Proxy-Anchor 61.7, MS 57.4, Proxy-NCA 49.2 (triplet semi-hard 42.6 in "
               "Proxy-NCA's CUB table); 512-D: Proxy-Anchor 68.4, MS 65.7")
_NCA_NUMBERS = "Cars196 R@1: Proxy-NCA 73.22, triplet semi-hard 51.54, lifted structure 52.98, N-pairs 53.90 (Table 1)"
_BASELINES = ("triplet-semihard", "lifted", "npairs")

CLAIMS: dict[str, Claim] = {claim.name: claim for claim in (
    Claim("proxy-anchor-accuracy", "Proxy-Anchor", "Table 2",
          "Proxy-Anchor retrieves better than Proxy-NCA, MS and triplet losses (every arm tuned alike)", _PA_NUMBERS,
          "map_at_r", tuple(Comparison("proxy-anchor", b) for b in ("proxy-nca", "ms", "triplet-semihard"))),
    Claim("proxy-anchor-accuracy-paper-values", "Proxy-Anchor", "Table 2",
          "Proxy-Anchor retrieves better than Proxy-NCA, MS and triplet losses, each at its paper's values "
          "(only the learning rate tuned; Proxy-NCA unscaled)", _PA_NUMBERS,
          "map_at_r", tuple(Comparison("proxy-anchor@paper", f"{b}@paper") for b in ("proxy-nca", "ms", "triplet-semihard"))),
    Claim("proxy-anchor-convergence", "Proxy-Anchor", "Fig. 1",
          "Proxy-Anchor converges faster than Proxy-NCA and the pair losses",
          "CUB R@1 against epochs and time: Proxy-Anchor's curve rises above Proxy-NCA's and MS's from the first "
          "epochs (a figure, no table)",
          "steps_to_threshold", tuple(Comparison("proxy-anchor", b) for b in ("proxy-nca", "ms", "triplet-semihard")),
          threshold_fraction=0.5),
    Claim("proxy-nca-accuracy", "Proxy-NCA", "Tables 1-3",
          "Proxy-NCA beats triplet (semi-hard), lifted structure and N-pairs losses", _NCA_NUMBERS,
          "map_at_r", tuple(Comparison("proxy-nca", b) for b in _BASELINES)),
    Claim("proxy-nca-convergence", "Proxy-NCA", "Fig. 1 / Sec. 6",
          "Proxy-NCA converges about three times faster than triplet-based losses",
          "Cars196 R@1 against steps: Proxy-NCA 'converges about three times as fast' as the triplet-based baselines",
          "steps_to_threshold", tuple(Comparison("proxy-nca", b) for b in _BASELINES), threshold_fraction=0.5),
    Claim("proxy-nca-fewer-proxies", "Proxy-NCA", "Sec. 6.5 / Fig. 6",
          "Half as many proxies as classes (static, random pre-assignment) is enough: equivalent to one a class",
          "Cars196 R@1 against proxies per class: with 0.5 or more Proxy-NCA still beats the previous methods; "
          "tested here also as equivalence with one proxy a class within 2 MAP@R points",
          "map_at_r", (Comparison("proxy-nca-half", "proxy-nca", kind="equivalent", margin=0.02),)),
    Claim("proxy-nca-half-vs-baselines", "Proxy-NCA", "Sec. 6.5 / Fig. 6",
          "With half as many proxies as classes Proxy-NCA still beats the triplet, lifted and N-pairs losses",
          "Cars196 R@1 against proxies per class: at 0.5 proxies a class above the previous methods' 51.5-53.9",
          "map_at_r", tuple(Comparison("proxy-nca-half", b) for b in _BASELINES)),
    Claim("dro-vs-average", "DRO", "Sec. 3 / Table 1",
          "Weighting pairs by DRO beats averaging the same base loss over every pair",
          "CUB R@1 (1024-D, margin base): DRO-TopK 67.4, DRO-TopK-PN 67.3, DRO-KL 67.7; the paper has no "
          "all-pairs row (Sec. 2-3 argue against averaged pair losses); here the average is DRO-TopK with K = every pair",
          "map_at_r", tuple(Comparison(a, "dro-all-pairs") for a in ("dro-topk", "dro-topk-pn", "dro-kl"))),
    Claim("dro-vs-baselines", "DRO", "Tables 1-2",
          "DRO-TopK-PN beats the multi-similarity and the (generalised) lifted-structure losses",
          "CUB R@1: DRO-TopK-PN (margin) 67.3 against MS 65.7 (Table 1, 1024-D)",
          "map_at_r", (Comparison("dro-topk-pn", "lifted-generalized"), Comparison("dro-topk-pn", "ms"))),
    Claim("dro-kl-g-vs-baselines", "DRO", "Table 2",
          "DRO-KL-G beats the lifted-structure and multi-similarity losses",
          "CUB R@1 at 64-D: MS 55.6, lifted structure 56.8, DRO-KL-G 56.4-57.0 (Table 2)",
          "map_at_r", (Comparison("dro-kl-g", "lifted-generalized"), Comparison("dro-kl-g", "ms"))),
    Claim("eps-letters", "EPS", "Table 3 (left)",
          "Trained on alphabet labels only, easy positive sampling retrieves characters better",
          "Omniglot-letters R@1: triplet+SH 49.4 -> 68.4, margin+DWS 49.4 -> 66.2, MS 57.7 -> 68.7 with EPS",
          "letters_recall_at_1", _EPS_PAIRS),
    Claim("eps-languages", "EPS", "Table 3 (right)",
          "Easy positive sampling also retrieves alphabets better (closed set: test characters come from the "
          "training alphabets)",
          "Omniglot-languages R@1: triplet+SH 71.0 -> 85.2, margin+DWS 73.2 -> 83.0, MS 78.8 -> 86.2 with EPS; "
          "NMI+ reported",
          "languages_recall_at_1", _EPS_PAIRS),
    Claim("eps-disjoint-alphabets", "EPS", "Table 3 (left), disjoint alphabets",
          "Trained on the alphabet labels of 3 alphabets, easy positive sampling retrieves the characters of the "
          "other 2 better",
          "Omniglot-letters R@1: triplet+SH 49.4 -> 68.4 with EPS (the paper's test alphabets are its training ones)",
          "letters_recall_at_1", (Comparison("eps-disjoint-triplet", "eps-disjoint-base-triplet"),)),
    Claim("asap-vs-pairs", "ASAP", "Table 1",
          "C2 with ASAP's alternating proxies beats C2 on the batch's pairs",
          "CUB MAP@R (4-fold, 128-D average): C2 21.01 -> C2-ASAP-L 22.67; 512-D ensemble 26.47 -> 28.02",
          "map_at_r", (Comparison("c2-asap", "c2"),)),
    Claim("asap-vs-one-problem", "ASAP", "Fig. 1 / Sec. 5.2",
          "Alternating proxy sets beat one proxy problem with the same proxies (whose proxies collapse)",
          "MNIST 2-D (a figure, no numbers): the single problem's proxies collapse, ASAP's cover each class",
          "map_at_r", (Comparison("c2-asap", "c2-proxy"),)),
    # ------------------------------------------------------------------ photos (grocery, EfficientNet-Lite0 fine-tuned)
    Claim("proxy-anchor-grocery", "Proxy-Anchor", "Table 2 (photos)",
          "Fine-tuning a pretrained backbone on grocery photos, Proxy-Anchor retrieves better than Proxy-NCA, MS and "
          "triplet losses", _PA_NUMBERS + "; Cars196: 78.8, 77.3, 73.2 (Proxy-Anchor, MS, Proxy-NCA)",
          "map_at_r", tuple(Comparison("grocery/proxy-anchor", f"grocery/{b}") for b in ("proxy-nca", "ms", "triplet-semihard"))),
    Claim("proxy-nca-grocery", "Proxy-NCA", "Tables 1-3 (photos)",
          "Fine-tuning on grocery photos, Proxy-NCA beats triplet, lifted structure and N-pairs losses", _NCA_NUMBERS,
          "map_at_r", tuple(Comparison("grocery/proxy-nca", f"grocery/{b}") for b in _BASELINES)),
    Claim("dro-grocery", "DRO", "Table 1 (photos)",
          "Fine-tuning on grocery photos, DRO-TopK-PN beats the all-pairs average and the multi-similarity loss",
          "CUB R@1 (1024-D, margin base): DRO-TopK-PN 67.3, MS 65.7",
          "map_at_r", tuple(Comparison("grocery/dro-topk-pn", f"grocery/{b}") for b in ("dro-all-pairs", "ms"))),
    Claim("eps-grocery", "EPS", "Sec. 1, Table 3 (photos)",
          "Trained on coarse grocery labels (43 kinds), easy positive sampling retrieves the fine products better "
          "(class collapse)",
          "Omniglot-letters R@1: triplet+SH 49.4 -> 68.4 with EPS (the paper has no photo set with coarse labels)",
          "fine_recall_at_1", (Comparison("grocery-coarse/eps-triplet", "grocery-coarse/eps-base-triplet"),)),
    Claim("eps-grocery-disjoint", "EPS", "Sec. 1, Table 3 (photos, disjoint kinds)",
          "Trained on the coarse labels of some grocery kinds, easy positive sampling retrieves the products of the "
          "other kinds better",
          "Omniglot-letters R@1: triplet+SH 49.4 -> 68.4 with EPS (the paper has no photo set with coarse labels)",
          "fine_recall_at_1", (Comparison("grocery-coarse-disjoint/eps-triplet",
                                          "grocery-coarse-disjoint/eps-base-triplet"),)),
    Claim("asap-grocery", "ASAP", "Table 1 (photos)",
          "Fine-tuning on grocery photos, C2 with ASAP's alternating proxies beats C2 on the batch's pairs",
          "CUB MAP@R (4-fold, 128-D average): C2 21.01 -> C2-ASAP-L 22.67",
          "map_at_r", (Comparison("grocery/c2-asap", "grocery/c2"),)),
)}

def is_photo_claim(name: str) -> bool:
    """Whether a claim's arms fine-tune the pretrained photo backbone (:mod:`dmlkit.claims.photos`)."""
    return any(ARMS[a].setting in PHOTO_SETTINGS for a in CLAIMS[name].arms)


def default_claims(device: str = "cpu") -> list[str]:
    """The claims a run without names covers: every claim (the photo claims run on a CPU too)."""
    return list(CLAIMS)


#: Claims this data cannot test, with the reason (docs/claims.md lists them).
UNTESTED: dict[str, str] = {
    "Proxy-Anchor Fig. 5 (embedding size)": "a trend across 64-1024 dimensions at CUB scale; on 44 training "
    "characters a 128-D embedding is not the bottleneck, so the trend cannot show (not run)",
    "Proxy-Anchor Fig. 6 (alpha, delta)": "a sensitivity surface, not a comparison: left to `dmlkit sweep`",
    "Proxy-Anchor Tables 5-6, DRO Fig. 1 (batch size)": "need batches of 30-640 drawn from >= 100 classes; the "
    "glyph runs have 44 training characters and the grocery runs about 26 training products, which cap a "
    "batch's classes far below the papers' range",
    "Proxy-NCA (more proxies than classes, Proxy-Triplet)": "the paper reports them without numbers that a small "
    "set can contrast; both are implemented (proxies_per_class > 1, ProxyTripletLoss)",
    "DRO binomial-base variants": "not run to keep the full run within 3 hours on 2 cores (each is one more tuned "
    "arm: 9 tuning and 8 seed runs); `dro` with base='binomial' is implemented and tested against the paper's "
    "equations",
    "ASAP against SoftTriple and Proxy-Anchor; ASAP Fig. 2-3 (lambda, K, b)": "not run in this budget: SoftTriple "
    "has three method parameters (centres, gamma, lambda), so one tuned parameter would not be tuned alike",
    "EPS Fig. 3(b) (positives per batch), Fig. 6 (trimmed loss)": "not run in this budget",
    "EPS margin and MS pairs on disjoint alphabets and on photos": "only the triplet pair runs there (the first "
    "row of the paper's Table 3), to keep the full run within 3 hours",
}


def apply_point(loss: dict, point: dict) -> dict:
    """The loss section with the point's method parameter set (``a+b``: both; ``pair_loss.x``: the nested loss's
    ``x``); a miner that has the same argument (a triplet margin) gets the value too."""
    loss = copy.deepcopy(loss)
    for key, value in point.items():
        if key == "lr":
            continue
        for name in key.split("+"):
            *path, leaf = name.split(".")
            target = loss.setdefault("args", {})
            for part in path:
                target = target[part].setdefault("args", {})
            target[leaf] = value
            miner_args = (loss.get("miner") or {}).get("args", {})
            if not path and leaf in miner_args:
                miner_args[leaf] = value
    return loss
