"""The arms and the claims: what each paper says, which trained arms test it, and how.

An :class:`Arm` is one training configuration (config sections of ``dmlkit.fit``: the loss with its
miner, ASAP's settings) in one glyph setting; arms are shared between claims (the MS arm serves
Proxy-Anchor's and DRO's claims). A :class:`Claim` names the paper's table or figure, the metric,
and its confirmatory :class:`Comparison`\\ s, which are Holm-corrected together.

Hyper-parameters are the papers' (or PML's defaults where a paper gives none); the learning rate
of every arm is chosen from :data:`LEARNING_RATES` on validation classes (``dmlkit.claims.runner``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The learning-rate grid every glyph arm chooses from (Adam-W, from scratch).
LEARNING_RATES = (3e-4, 1e-3, 3e-3)
#: The grid of the photo arms (the pretrained backbone's rate; the head learns 10x, proxies 100x faster).
PHOTO_LEARNING_RATES = (1e-5, 1e-4)
#: The photo settings (:mod:`dmlkit.claims.photos`); the others are glyph settings (:mod:`dmlkit.claims.glyphs`).
PHOTO_SETTINGS = ("miniimagenet",)


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
    #: Extra loss arguments tuned with the learning rate on validation classes: ``{arg: (values...)}``.
    tuned: dict = field(default_factory=dict)
    #: Train at the point another arm chose instead of tuning (an ablation of that arm: only one thing differs).
    tuned_with: str | None = None
    #: Steps as a multiple of the budget's (every arm of a claim has the same): ASAP's projections run "until
    #: convergence" (early stopping with patience 3 on validation MAP@R), which 300 steps of a CNN still
    #: improving never reach, so its claims train 4x longer for all their arms.
    steps_scale: int = 1


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
    #: The validation MAP@R that convergence claims time the arms to (``metric='steps_to_threshold'``).
    threshold: float | None = None

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
#: Proxy-NCA's softmax scale (1 / temperature) is tuned with the learning rate: at scale 1 the logits of
#: unit vectors span +-2 and Eq. (4) barely separates 32 or more proxies.
_NCA_SCALES = (1.0, 8.0, 32.0)

ARMS: dict[str, Arm] = {arm.name: arm for arm in (
    # ------------------------------------------------------------------ characters: classes are characters
    Arm("proxy-anchor", "characters", "Proxy-Anchor, Eq. (4) (alpha 32, delta 0.1)",
        {"name": "proxy_anchor", "args": {"margin": 0.1, "alpha": 32.0}}),
    Arm("proxy-nca", "characters", "Proxy-NCA, Eq. (4): positive proxy out of the denominator, scale tuned",
        {"name": "proxy_nca", "args": {"exclude_positive": True}}, tuned={"softmax_scale": _NCA_SCALES}),
    Arm("proxy-nca-half", "characters", "Proxy-NCA with half as many proxies as classes (static assignment)",
        {"name": "proxy_nca", "args": {"exclude_positive": True, "proxies_per_class": 0.5}}, tuned_with="proxy-nca"),
    Arm("triplet-semihard", "characters", "triplet loss (margin 0.2) with semi-hard mining",
        {**_TRIPLET, "miner": _miner("triplet_margin", margin=0.2, type_of_triplets="semihard")}),
    Arm("lifted", "characters", "lifted structure (Oh Song et al. 2016, negative margin 1)",
        {"name": "lifted_structure", "args": {"neg_margin": 1.0, "pos_margin": 0.0}}),
    Arm("npairs", "characters", "N-pairs (Sohn 2016)", {"name": "npairs", "args": {}}),
    Arm("ms", "characters", "multi-similarity loss with its miner (alpha 2, beta 50, lambda 0.5, epsilon 0.1)",
        {**_MS, "miner": _miner("multi_similarity", epsilon=0.1)}),
    Arm("lifted-generalized", "characters", "generalised lifted structure (log-sum-exp form, DRO Table 1)",
        {"name": "generalized_lifted_structure", "args": {"neg_margin": 1.0, "pos_margin": 0.0}}),
    Arm("dro-all-pairs", "characters", "margin loss averaged over every pair (DRO-TopK with K = every pair)",
        {"name": "dro", "args": {"weighting": "top_k", **_DRO_BASE, "k": 1_000_000}}),
    Arm("dro-topk", "characters", "DRO-TopK, margin base (K = 2B = 128)",
        {"name": "dro", "args": {"weighting": "top_k", **_DRO_BASE, "k": _DRO_K}}),
    Arm("dro-topk-pn", "characters", "DRO-TopK-PN, margin base (64 positive + 64 negative pairs)",
        {"name": "dro", "args": {"weighting": "top_k_pn", **_DRO_BASE, "k_pos": _DRO_K // 2, "k_neg": _DRO_K // 2}}),
    Arm("dro-kl", "characters", "DRO-KL, margin base (gamma 0.1, 128 pairs sampled from p*)",
        {"name": "dro", "args": {"weighting": "kl", **_DRO_BASE, "gamma": 0.1, "sample": True, "num_samples": _DRO_K}}),
    Arm("c2", "characters", "C2 contrastive on the batch's pairs (margins 0 / 0.3841), bounded normalisation",
        {"name": "contrastive", "args": {"distance": "euclidean", "pos_margin": 0.0, "neg_margin": 0.3841}},
        normalization="bounded", steps_scale=4),
    Arm("c2-proxy", "characters", "C2 against K = 8 learnt proxies a class, one problem (proxies start as ASAP's: "
        "k-center on sample embeddings), no alternation",
        _C2_PROXY_LOSS, {"enabled": True, "proxies_per_class": _ASAP_K, "pool_size": _ASAP_B, "proximal_lambda": 0.0,
                         "max_projections": 1, "patience": 1000}, normalization="bounded", steps_scale=4),
    Arm("c2-asap", "characters", "C2-ASAP: K = 8, b = 12, lambda 2e-4, a projection ends after 3 validations "
        "without a gain (the paper's early stopping)",
        _C2_PROXY_LOSS, {"enabled": True, "proxies_per_class": _ASAP_K, "pool_size": _ASAP_B, "proximal_lambda": 2e-4,
                         "patience": 3, "max_projections": 20, "projections_without_improvement": 3},
        normalization="bounded", steps_scale=4),
    # ------------------------------------------------------------------ photos: the pretrained backbone fine-tuned
    *(arm for setting in PHOTO_SETTINGS for arm in (
        Arm(f"{setting}/proxy-anchor", setting, "Proxy-Anchor (alpha 32, delta 0.1), EfficientNet-Lite0 fine-tuned",
            {"name": "proxy_anchor", "args": {"margin": 0.1, "alpha": 32.0}}),
        Arm(f"{setting}/proxy-nca", setting, "Proxy-NCA, Eq. (4), scale tuned, EfficientNet-Lite0 fine-tuned",
            {"name": "proxy_nca", "args": {"exclude_positive": True}}, tuned={"softmax_scale": _NCA_SCALES[1:]}),
        Arm(f"{setting}/ms", setting, "multi-similarity loss with its miner, EfficientNet-Lite0 fine-tuned",
            {**_MS, "miner": _miner("multi_similarity", epsilon=0.1)}),
    )),
    # ------------------------------------------------------------------ alphabets: trained on alphabet labels (EPS)
    Arm("eps-base-triplet", "alphabets", "triplet + semi-hard positives and negatives (EPS's baseline)",
        {**_TRIPLET, "miner": _miner("triplet_margin", margin=0.2, type_of_triplets="semihard")}),
    Arm("eps-triplet", "alphabets", "triplet: easy positive, semi-hard negatives",
        {**_TRIPLET, "miner": _miner("easy_positive", negative="semihard", margin=0.2)}),
    Arm("eps-base-margin", "alphabets", "margin loss with distance-weighted sampling",
        {**_MARGIN, "miner": _miner("distance_weighted", cutoff=0.5, nonzero_loss_cutoff=1.4)}),
    Arm("eps-margin", "alphabets", "margin loss: easy positive, distance-weighted negatives",
        {**_MARGIN, "miner": _miner("easy_positive", negative="distance_weighted")}),
    Arm("eps-base-ms", "alphabets", "MS loss with its miner (alpha 2, beta 50, lambda 1)",
        {**_MS_EPS, "miner": _miner("multi_similarity", epsilon=0.1)}),
    Arm("eps-ms", "alphabets", "MS loss: easy positive, MS negatives",
        {**_MS_EPS, "miner": _miner("easy_positive", negative="multi_similarity", epsilon=0.1)}),
)}

#: Validation MAP@R (characters) that the convergence claims time arms to reach.
CONVERGENCE_THRESHOLD = 0.6

_EPS_PAIRS = tuple(Comparison(f"eps-{k}", f"eps-base-{k}") for k in ("triplet", "margin", "ms"))

CLAIMS: dict[str, Claim] = {claim.name: claim for claim in (
    Claim("proxy-anchor-accuracy", "Proxy-Anchor", "Table 2",
          "Proxy-Anchor retrieves better than Proxy-NCA, MS and triplet losses",
          "CUB R@1 (BN-Inception, 64-D): Proxy-Anchor 61.7, MS 57.4, Proxy-NCA 49.2 (triplet semi-hard 42.6 in "
          "Proxy-NCA's CUB table); 512-D: Proxy-Anchor 68.4, MS 65.7",
          "map_at_r", tuple(Comparison("proxy-anchor", b) for b in ("proxy-nca", "ms", "triplet-semihard"))),
    *(Claim(f"proxy-anchor-{setting}", "Proxy-Anchor", "Table 2 (photos)",
            f"Fine-tuning a pretrained backbone on {name}, Proxy-Anchor retrieves better than Proxy-NCA and MS",
            "CUB R@1 (BN-Inception, 64-D): Proxy-Anchor 61.7, MS 57.4, Proxy-NCA 49.2; Cars196: 78.8, 77.3, 73.2",
            "map_at_r", tuple(Comparison(f"{setting}/proxy-anchor", f"{setting}/{b}") for b in ("proxy-nca", "ms")))
      for setting, name in (("miniimagenet", "mini-ImageNet classes"),)),
    Claim("proxy-anchor-convergence", "Proxy-Anchor", "Fig. 1",
          "Proxy-Anchor converges faster than Proxy-NCA and the pair losses",
          "CUB R@1 against epochs and time: Proxy-Anchor's curve rises above Proxy-NCA's and MS's from the first "
          "epochs (a figure, no table)",
          "steps_to_threshold", tuple(Comparison("proxy-anchor", b) for b in ("proxy-nca", "ms", "triplet-semihard")),
          threshold=CONVERGENCE_THRESHOLD),
    Claim("proxy-nca-accuracy", "Proxy-NCA", "Tables 1-3",
          "Proxy-NCA beats triplet (semi-hard), lifted structure and N-pairs losses",
          "Cars196 R@1: Proxy-NCA 73.22, triplet semi-hard 51.54, lifted structure 52.98, N-pairs 53.90 (Table 1)",
          "map_at_r", tuple(Comparison("proxy-nca", b) for b in ("triplet-semihard", "lifted", "npairs"))),
    Claim("proxy-nca-convergence", "Proxy-NCA", "Fig. 1 / Sec. 6",
          "Proxy-NCA converges about three times faster than triplet-based losses",
          "Cars196 R@1 against steps: Proxy-NCA 'converges about three times as fast' as the triplet-based baselines",
          "steps_to_threshold", tuple(Comparison("proxy-nca", b) for b in ("triplet-semihard", "lifted", "npairs")),
          threshold=CONVERGENCE_THRESHOLD),
    Claim("proxy-nca-fewer-proxies", "Proxy-NCA", "Sec. 6.5 / Fig. 6",
          "Half as many proxies as classes (static, random pre-assignment) is enough",
          "Cars196 R@1 against proxies per class: with 0.5 or more Proxy-NCA still beats the previous methods; "
          "tested here as equivalence with one proxy a class within 2 MAP@R points",
          "map_at_r", (Comparison("proxy-nca-half", "proxy-nca", kind="equivalent", margin=0.02),)),
    Claim("dro-vs-average", "DRO", "Sec. 3 / Table 1",
          "Weighting pairs by DRO beats averaging the same base loss over every pair",
          "CUB R@1 (1024-D, margin base): DRO-TopK 67.4, DRO-TopK-PN 67.3, DRO-KL 67.7; the paper has no "
          "all-pairs row (Sec. 2-3 argue against averaged pair losses); here the average is DRO-TopK with K = every pair",
          "map_at_r", tuple(Comparison(a, "dro-all-pairs") for a in ("dro-topk", "dro-topk-pn", "dro-kl"))),
    Claim("dro-vs-baselines", "DRO", "Tables 1-2",
          "DRO-TopK-PN beats the multi-similarity and the (generalised) lifted-structure losses",
          "CUB R@1: DRO-TopK-PN (margin) 67.3 against MS 65.7 (Table 1, 1024-D); at 64-D MS 55.6, lifted structure "
          "56.8, DRO-KL-G 56.4-57.0 (Table 2)",
          "map_at_r", (Comparison("dro-topk-pn", "lifted-generalized"), Comparison("dro-topk-pn", "ms"))),
    Claim("eps-letters", "EPS", "Table 3 (left)",
          "Trained on alphabet labels only, easy positive sampling retrieves characters better",
          "Omniglot-letters R@1: triplet+SH 49.4 -> 68.4, margin+DWS 49.4 -> 66.2, MS 57.7 -> 68.7 with EPS",
          "letters_recall_at_1", _EPS_PAIRS),
    Claim("eps-languages", "EPS", "Table 3 (right)",
          "Easy positive sampling also retrieves alphabets better",
          "Omniglot-languages R@1: triplet+SH 71.0 -> 85.2, margin+DWS 73.2 -> 83.0, MS 78.8 -> 86.2 with EPS",
          "languages_recall_at_1", _EPS_PAIRS),
    Claim("asap-vs-pairs", "ASAP", "Table 1",
          "C2 with ASAP's alternating proxies beats C2 on the batch's pairs",
          "CUB MAP@R (4-fold, 128-D average): C2 21.01 -> C2-ASAP-L 22.67; 512-D ensemble 26.47 -> 28.02",
          "map_at_r", (Comparison("c2-asap", "c2"),)),
    Claim("asap-vs-one-problem", "ASAP", "Fig. 1 / Sec. 5.2",
          "Alternating proxy sets beat one proxy problem with the same proxies (whose proxies collapse)",
          "MNIST 2-D (a figure, no numbers): the single problem's proxies collapse, ASAP's cover each class",
          "map_at_r", (Comparison("c2-asap", "c2-proxy"),)),
)}

def is_photo_claim(name: str) -> bool:
    """Whether a claim's arms fine-tune the pretrained photo backbone (run by default only on a GPU)."""
    return any(ARMS[a].setting in PHOTO_SETTINGS for a in CLAIMS[name].arms)


def default_claims(device: str) -> list[str]:
    """The claims a run without names covers: every claim on a GPU, the glyph claims on a CPU."""
    return [name for name in CLAIMS if device.startswith("cuda") or not is_photo_claim(name)]


#: Claims this data cannot test, with the reason (docs/results.md lists them).
UNTESTED: dict[str, str] = {
    "Proxy-Anchor Fig. 5 (embedding size)": "tested only as a trend across 64-1024 dimensions at CUB scale; "
    "on 68 glyph classes a 128-D embedding is not the bottleneck, so the trend cannot show (not run)",
    "Proxy-Anchor Fig. 6 (alpha, delta)": "a sensitivity surface, not a comparison: left to `dmlkit sweep`",
    "Proxy-Anchor Tables 5-6 (batch size at equal epochs)": "needs batches of 30-180 drawn from >= 100 classes; "
    "54 training characters cap batches at 54 classes",
    "Proxy-NCA (more proxies than classes, Proxy-Triplet)": "the paper reports them without numbers that a small "
    "set can contrast; both are implemented (proxies_per_class > 1, ProxyTripletLoss)",
    "DRO Fig. 1 (robustness to pair imbalance over batch sizes 80-640)": "batches of 320-640 need SOP-scale "
    "class counts; 54 characters hold at most 1,080 images",
    "DRO KL and binomial variants on photos": "not run: a photo run is long on a CPU (30 steps took 462 s on 2 "
    "shared cores), so only Proxy-Anchor's Table 2 has a photo arm set (run with --device cuda)",
    "EPS Fig. 3(b) (positives per batch), Fig. 6 (trimmed loss)": "not run in this budget",
    "ASAP Fig. 2 (lambda), Fig. 3 (K and b), comparison with Proxy-Anchor and SoftTriple": "not run in this budget",
}
