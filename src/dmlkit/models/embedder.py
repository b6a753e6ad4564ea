"""The embedding network: trunk (backbone) -> global pooling -> linear head -> normalisation."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from dmlkit.core.validation import Interval, Options, validate_params
from dmlkit.distances import normalize
from dmlkit.distances.normalization import NORMALIZATIONS
from dmlkit.exceptions import ConfigError, InvalidParameterError
from dmlkit.models.preprocessing import check_cfg, preprocess

POOLINGS = ("avg", "max", "avg+max", "gem")

#: Exponent of generalised-mean pooling (Radenovic et al., TPAMI 2019: p = 3 for retrieval).
GEM_P = 3.0


class GlobalPool(nn.Module):
    """Pool a feature map ``[B, C, H, W]`` to ``[B, C]`` (a ``[B, C]`` input passes through).

    ``"avg+max"`` adds the average- and max-pooled vectors (the Proxy-Anchor reference code's
    choice), so the feature size stays ``C``. ``"gem"`` is the generalised mean
    ``(mean_hw max(x, eps)^p)^(1/p)`` with ``p = 3`` (between average, p = 1, and max, p -> inf),
    computed in fp32.
    """

    def __init__(self, pooling: str = "avg"):
        super().__init__()
        validate_params("GlobalPool", {"pooling": pooling}, {"pooling": [Options(POOLINGS)]})
        self.pooling = pooling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            return x
        if self.pooling == "avg":
            return x.mean(dim=(-2, -1))
        if self.pooling == "max":
            return x.amax(dim=(-2, -1))
        if self.pooling == "gem":
            return _at_least_fp32(x).clamp_min(1e-6).pow(GEM_P).mean(dim=(-2, -1)).pow(1.0 / GEM_P)
        return x.mean(dim=(-2, -1)) + x.amax(dim=(-2, -1))

    def extra_repr(self) -> str:
        return f"pooling={self.pooling!r}"


HEAD_INITS = ("kaiming", "identity")


def make_linear_head(num_features: int, embedding_size: int, init: str = "kaiming") -> nn.Linear:
    """A linear layer ``num_features -> embedding_size`` with zero bias.

    ``init="kaiming"``: Kaiming-normal fan-out weights (a random projection). ``init="identity"``
    (needs ``embedding_size == num_features``): the identity, so the untrained embedding is exactly
    the normalised pooled backbone feature and training starts from what a pretrained backbone knows.
    """
    validate_params("make_linear_head", {"init": init}, {"init": [Options(HEAD_INITS)]})
    if init == "identity" and embedding_size != num_features:
        raise InvalidParameterError(
            f"head init 'identity' needs embedding_size == the backbone's {num_features} features. "
            f"Got embedding_size={embedding_size}; use init 'kaiming' for a projection."
        )
    head = nn.Linear(num_features, embedding_size)
    if init == "identity":
        with torch.no_grad():
            head.weight.copy_(torch.eye(num_features))
    else:
        nn.init.kaiming_normal_(head.weight, mode="fan_out")
    nn.init.zeros_(head.bias)
    return head


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in fp32 when it is in a lower precision (bf16/fp16 under autocast); fp64 stays fp64."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


class EmbedsImages:
    """``embed(images)`` for a model loaded from a run (``dmlkit.load``): image files, PIL images, numpy arrays or
    pixel tensors in, embeddings ``[N, E]`` out, prepared as the run prepared its test split.

    The work is done by the :class:`dmlkit.inference.RunEmbedder` that loaded the model (``run_embedder``), the
    same object ``dmlkit embed``, ``index`` and ``export`` use; a model built here (``create_model``) has none.
    """

    #: The loading run's embedder (set by :meth:`dmlkit.inference.RunEmbedder.from_run`); None for a built model.
    run_embedder = None

    def _loaded(self):
        if self.run_embedder is None:
            raise ConfigError(
                f"This {type(self).__name__} was built, not loaded from a run: `embed` prepares images as a run "
                "evaluated them, which only a loaded model knows (model = dmlkit.load(RUN_DIR or 'hf://user/name')). "
                "A batch of pixels runs as model(model.preprocess(pixels))."
            )
        return self.run_embedder

    def embed(self, images) -> torch.Tensor:
        """Embeddings ``[N, E]`` (float32, CPU, eval mode) of ``images``, in order: a path, PIL image, numpy array
        (``[H, W]`` / ``[H, W, C]``, or ``[N, H, W, C]`` for many) or tensor (``[C, H, W]`` / ``[N, C, H, W]``),
        or a list of them (pixels uint8 0-255 or float in [0, 1])."""
        return self._loaded().embed(images)

    @property
    def fingerprint(self) -> dict[str, str]:
        """What identifies the loaded weights (config fingerprint, weights digest), as an index checks it."""
        return self._loaded().fingerprint

    @property
    def run_dir(self):
        """The run directory (or shared folder) the model was loaded from; None for a built model."""
        return None if self.run_embedder is None else self.run_embedder.run_dir


class Embedder(EmbedsImages, nn.Module):
    """Map images ``[B, C, H, W]`` to embeddings ``[B, embedding_size]``.

    ``trunk`` returns a feature map ``[B, F, h, w]`` (or features ``[B, F]``), ``pool`` reduces it
    to ``[B, F]``, ``head`` maps it to ``[B, E]`` and the result is L2-normalised, projected onto
    the unit ball (ASAP Sec. 4.4, ``"bounded"``) or left as is (``"none"``).
    With ``shift_average=r > 0`` an embedder in eval mode embeds the input shifted by every offset
    in ``[-r, r]`` pixels on both axes (border pixels repeated) and returns the normalised mean of
    those ``(2r+1)^2`` embeddings; training is unchanged. Small images (digits, glyphs) then get
    embeddings that do not jump with a one-pixel shift (Omniglot test MAP@R +0.05 to +0.10,
    docs/recipes.md). With ``flip_average=True`` (photos) an eval-mode embedding is the normalised
    sum of the embeddings of the image and its mirror image.
    With ``freeze_bn=True`` the trunk's batch-norm layers stay in eval mode (running statistics
    frozen) even when the embedder is in training mode.
    """

    def __init__(
        self,
        trunk: nn.Module,
        pool: nn.Module,
        head: nn.Module,
        normalization: str = "l2",
        *,
        pretrained_cfg: Mapping[str, Any] | None = None,
        freeze_bn: bool = False,
        shift_average: int = 0,
        flip_average: bool = False,
    ):
        super().__init__()
        validate_params(
            "Embedder",
            {"normalization": normalization, "freeze_bn": freeze_bn, "shift_average": shift_average,
             "flip_average": flip_average},
            {"normalization": [Options(NORMALIZATIONS)], "freeze_bn": [Options((True, False))],
             "shift_average": [Interval(int, 0, None)], "flip_average": [Options((True, False))]},
        )
        self.shift_average = shift_average
        self.flip_average = flip_average
        self.trunk = trunk
        self.pool = pool
        self.head = head
        self.normalization = normalization
        self.freeze_bn = freeze_bn
        if pretrained_cfg is None:
            pretrained_cfg = getattr(trunk, "pretrained_cfg", None)
        if pretrained_cfg is None:
            raise ValueError("Embedder needs a pretrained_cfg (from the trunk or passed explicitly).")
        check_cfg(pretrained_cfg)
        self.pretrained_cfg: dict[str, Any] = dict(pretrained_cfg)
        self.weights_report = None
        self.pretrained_weights = None  # dmlkit.models.hub.PretrainedWeights, set by create_model
        self.train(self.training)

    @property
    def embedding_size(self) -> int:
        """Size E of the output embeddings."""
        return int(self.head.out_features) if hasattr(self.head, "out_features") else -1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Embed a batch of preprocessed images: ``[B, C, H, W] -> [B, E]``."""
        if self.training or x.dim() != 4:
            return self._embed(x)
        if self.flip_average:  # the image and its mirror in one batched pass
            both = self._eval_embed(torch.cat([x, x.flip(-1)]))
            return normalize(both[: x.shape[0]] + both[x.shape[0]:], self.normalization)
        return self._eval_embed(x)

    def _eval_embed(self, x: torch.Tensor) -> torch.Tensor:
        return self._shift_averaged(x, self.shift_average) if self.shift_average else self._embed(x)

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """Trunk (under the caller's autocast, if any), then pooling, head and normalisation in fp32.

        The head is a small share of the work but its rounding is not: a bf16 product over 1,280
        pooled features cost 0.015 MAP@R on the Pets development set (docs/recipes.md).
        """
        return self._head_and_normalisation(self.trunk(x))

    def _head_and_normalisation(self, trunk_output: torch.Tensor) -> torch.Tensor:
        features = _at_least_fp32(trunk_output)
        with torch.autocast(trunk_output.device.type, enabled=False):
            return normalize(self.head(self.pool(features)), self.normalization)

    def prefix_problem(self) -> str | None:
        """Why :meth:`prefix` / :meth:`forward_from_prefix` cannot reproduce training (None: they can).

        The prefix must be a fixed function during training: a trunk that splits after its frozen
        stages (:meth:`TimmTrunk.split_problem`), batch-norm statistics frozen (``freeze_bn``) and no
        dropout or drop-path in the frozen stages.
        """
        split_problem = getattr(self.trunk, "split_problem", None)
        if split_problem is None:
            return f"the trunk {type(self.trunk).__name__} has no frozen stages to split off (timm backbones do)"
        problem = split_problem()
        if problem is not None:
            return problem
        if not self.freeze_bn:
            return "model.freeze_bn=False: the frozen stages' batch-norm statistics change with every batch"
        for module in self.trunk.split_modules()[0]:
            for layer in module.modules():
                dropout = isinstance(layer, nn.modules.dropout._DropoutNd)
                rate = float(layer.p if dropout else getattr(layer, "drop_prob", 0.0) or 0.0)  # timm's DropPath
                if rate > 0:
                    return f"the frozen stages hold a random layer ({type(layer).__name__}, rate {rate:g})"
        return None

    def prefix(self, images: torch.Tensor) -> torch.Tensor:
        """The trunk's stem and frozen stages without gradients: ``[B, C, H, W] -> [B, C', h, w]``.

        With :meth:`prefix_problem` None, ``forward_from_prefix(prefix(x))`` is ``model(x)`` in
        training mode (the frozen stages get no gradient either way); the prefix runs under the
        caller's autocast, as the trunk does.
        """
        with torch.no_grad():
            return self.trunk.forward_prefix(images)

    def forward_from_prefix(self, features: torch.Tensor) -> torch.Tensor:
        """The trunk's trained stages, pooling, head and normalisation on :meth:`prefix`'s output: ``[B, E]``."""
        return self._head_and_normalisation(self.trunk.forward_suffix(features))

    def features_from_prefix(self, features: torch.Tensor) -> torch.Tensor:
        """Pooled trunk features ``[B, F]`` (fp32, before the head) from :meth:`prefix`'s output: :meth:`features`
        of the images it came from."""
        trunk_output = _at_least_fp32(self.trunk.forward_suffix(features))
        with torch.autocast(features.device.type, enabled=False):
            return self.pool(trunk_output)

    def _shift_averaged(self, x: torch.Tensor, r: int) -> torch.Tensor:
        """Normalised mean embedding of ``x`` shifted by every offset in ``[-r, r]^2`` (a batched pass per offset)."""
        h, w = x.shape[-2:]
        padded = torch.nn.functional.pad(x, (r, r, r, r), mode="replicate")
        total = None
        for dy in range(-r, r + 1):
            for dx in range(-r, r + 1):
                embedding = self._embed(padded[:, :, r + dy:r + dy + h, r + dx:r + dx + w])
                total = embedding if total is None else total + embedding
        return normalize(total / (2 * r + 1) ** 2, self.normalization)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled trunk features ``[B, F]`` (fp32) before the head."""
        features = _at_least_fp32(self.trunk(x))
        with torch.autocast(x.device.type, enabled=False):
            return self.pool(features)

    def preprocess(self, images: torch.Tensor, *, resize: bool = False) -> torch.Tensor:
        """Apply this model's ``pretrained_cfg`` to RGB/grey images (uint8 0..255 or float [0, 1])."""
        return preprocess(images, self.pretrained_cfg, resize=resize)

    def train(self, mode: bool = True) -> "Embedder":
        """Set training mode; with ``freeze_bn`` the trunk's batch-norm layers stay in eval mode.

        Their affine weights still receive gradients; only the running statistics are frozen.
        """
        super().train(mode)
        if self.freeze_bn:
            for module in self.trunk.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
        return self

    def trunk_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters of the backbone (for a separate optimiser group / learning rate)."""
        return self.trunk.parameters()

    def head_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters of the pooling and embedding head."""
        yield from self.pool.parameters()
        yield from self.head.parameters()

    def extra_repr(self) -> str:
        return (f"normalization={self.normalization!r}, freeze_bn={self.freeze_bn}, shift_average={self.shift_average}, "
                f"flip_average={self.flip_average}")


@contextlib.contextmanager
def shift_radius(model: nn.Module, radius: int | None) -> Iterator[None]:
    """Within the block, every :class:`Embedder` in ``model`` (an ensemble's members too) averages its eval-mode
    embeddings over shifts of up to ``radius`` pixels instead of its own ``shift_average``; ``None`` changes nothing.
    The validation embeds so (``eval.val_shift_average``): fewer shifts than the test embedding, a fraction of the
    cost, and the checkpoints it compares are all embedded alike."""
    if radius is None:
        yield
        return
    embedders = [m for m in model.modules() if isinstance(m, Embedder)]
    saved = [m.shift_average for m in embedders]
    try:
        for m in embedders:
            m.shift_average = int(radius)
        yield
    finally:
        for m, r in zip(embedders, saved):
            m.shift_average = r

