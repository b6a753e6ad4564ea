"""2-D picture of test embeddings coloured by class, proxies drawn on top."""

from __future__ import annotations

import colorsys

import numpy as np

from dmlkit.report.figures import DEFAULT_DPI, figure_to_base64_png, new_figure
from dmlkit.report.run_dir import TestEmbeddings

EMBEDDING_METHODS = ("pca", "tsne")
MAX_LEGEND_CLASSES = 20


def subsample_indices(num_points: int, max_points: int, seed: int) -> np.ndarray:
    """Sorted indices of at most ``max_points`` of ``num_points`` rows, chosen by ``seed``."""
    if num_points <= max_points:
        return np.arange(num_points)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(num_points, size=max_points, replace=False))


def pca_2d(points: np.ndarray, extra: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Project ``points`` [N, D] (and ``extra`` [P, D] with the same map) on their top 2 principal axes.

    Axis signs are fixed so the largest loading of each axis is positive (reproducible pictures).
    """
    points = points.astype(np.float64)
    mean = points.mean(axis=0)
    centred = points - mean
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    axes = vt[:2]
    if axes.shape[0] < 2:  # D == 1 or a single point: pad with a zero axis
        axes = np.vstack([axes, np.zeros((2 - axes.shape[0], points.shape[1]))])
    signs = np.sign(axes[np.arange(2), np.abs(axes).argmax(axis=1)])
    axes = axes * np.where(signs == 0, 1.0, signs)[:, None]
    coords = centred @ axes.T
    extra_coords = None if extra is None else (extra.astype(np.float64) - mean) @ axes.T
    return coords, extra_coords


def tsne_2d(points: np.ndarray, extra: np.ndarray | None, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
    """t-SNE of ``points`` [N, D] and ``extra`` [P, D] fitted jointly (t-SNE has no out-of-sample map).

    Runs single-threaded: OpenMP spin-waiting made it 30x slower on a shared, busy machine.
    """
    from sklearn.manifold import TSNE
    from threadpoolctl import threadpool_limits

    joint = points if extra is None else np.concatenate([points, extra], axis=0)
    joint = joint.astype(np.float64)
    if joint.shape[0] < 5:
        return pca_2d(points, extra)
    perplexity = float(min(30.0, (joint.shape[0] - 1) / 3.0))
    with threadpool_limits(limits=1):
        coords = TSNE(n_components=2, init="pca", perplexity=perplexity, random_state=seed).fit_transform(joint)
    n = points.shape[0]
    return coords[:n], (None if extra is None else coords[n:])


def class_colors(labels: np.ndarray) -> dict[int, tuple[float, float, float]]:
    """A distinct RGB colour per class id: tab20 up to 20 classes, golden-ratio hues beyond."""
    classes = np.unique(labels)
    if classes.size <= 20:
        from matplotlib import colormaps

        palette = colormaps["tab10" if classes.size <= 10 else "tab20"]
        return {int(c): tuple(palette(i)[:3]) for i, c in enumerate(classes)}
    golden = 0.618033988749895
    return {
        int(c): colorsys.hsv_to_rgb((i * golden) % 1.0, 0.65 + 0.3 * (i % 2), 0.85 - 0.25 * (i % 3 == 2))
        for i, c in enumerate(classes)
    }


def data_limits(coords: np.ndarray, margin: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Axis limits ``(low [2], high [2])`` spanning the points ``coords [N, 2]`` with a ``margin`` fraction
    on each side (the map is scaled to the test points, never to the proxies)."""
    low, high = coords.min(axis=0), coords.max(axis=0)
    pad = np.maximum((high - low) * margin, 1e-9)
    return low - pad, high + pad


def embedding_map_png(
    data: TestEmbeddings,
    *,
    method: str = "pca",
    max_points: int = 2000,
    seed: int = 0,
    dpi: int = DEFAULT_DPI,
) -> tuple[str, str]:
    """Scatter of the test embeddings in 2-D coloured by class; returns (base64 PNG, caption).

    2-D embeddings are drawn as they are; wider ones are reduced by PCA or t-SNE after a
    seeded subsample of at most ``max_points`` rows.
    """
    index = subsample_indices(data.labels.shape[0], max_points, seed)
    points = data.embeddings[index]
    labels = data.labels[index]
    proxies = data.proxies
    dim = points.shape[1]
    if dim == 2:
        coords = points.astype(np.float64)
        proxy_coords = None if proxies is None else proxies.astype(np.float64)
        how = "the 2-D embeddings themselves"
    elif method == "tsne":
        coords, proxy_coords = tsne_2d(points, proxies, seed)
        how = f"t-SNE of the {dim}-D embeddings"
    else:
        coords, proxy_coords = pca_2d(points, proxies)
        how = f"PCA (first two principal axes) of the {dim}-D embeddings"
    colors = class_colors(labels if data.proxy_labels is None else np.concatenate([labels, data.proxy_labels]))
    fig = new_figure(6.4, 5.2)
    ax = fig.subplots()
    point_colors = np.array([colors[int(c)] for c in labels]).reshape(-1, 3)
    size = 14 if len(index) <= 500 else 6
    ax.scatter(coords[:, 0], coords[:, 1], c=point_colors, s=size, alpha=0.75, linewidths=0)
    low, high = data_limits(coords)
    outside = 0
    if proxy_coords is not None:
        if data.proxy_labels is not None:
            proxy_colors = np.array([colors[int(c)] for c in data.proxy_labels]).reshape(-1, 3)
        else:
            proxy_colors = np.zeros((proxy_coords.shape[0], 3))
        clipped = np.clip(proxy_coords, low, high)
        beyond = (clipped != proxy_coords).any(axis=1)
        outside = int(beyond.sum())
        ax.scatter(clipped[~beyond, 0], clipped[~beyond, 1], c=proxy_colors[~beyond], s=90, marker="*",
                   edgecolors="black", linewidths=0.8, zorder=3)
        ax.scatter([], [], s=90, marker="*", facecolors="white", edgecolors="black", label="proxies")
        if outside:
            ax.scatter(clipped[beyond, 0], clipped[beyond, 1], c=proxy_colors[beyond], s=70, marker="D",
                       edgecolors="black", linewidths=0.8, zorder=3, clip_on=False)
            ax.scatter([], [], s=50, marker="D", facecolors="white", edgecolors="black",
                       label="proxies beyond the data (on the edge)")
    classes = np.unique(labels)
    if classes.size <= MAX_LEGEND_CLASSES:
        for c in classes:
            ax.scatter([], [], color=colors[int(c)], s=20, label=f"class {int(c)}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.set_xlim(low[0], high[0])
    ax.set_ylim(low[1], high[1])
    ax.set_aspect("equal", adjustable="box")
    ax.grid(alpha=0.25)
    ax.set_title(f"Test embeddings\n({how})", fontsize=9)  # two lines: a long method name stays inside the figure
    caption = (
        f"{len(index)} of {data.labels.shape[0]} test points"
        + (f" (seeded subsample, seed {seed})" if len(index) < data.labels.shape[0] else "")
        + f", {classes.size} classes, {how}"
        + (f"; {proxies.shape[0]} proxies drawn as stars" if proxies is not None else "")
        + (f", {outside} of them beyond the test points' range drawn as diamonds on the edge (the axes are "
           "scaled to the test points)" if outside else "")
        + "."
    )
    return figure_to_base64_png(fig, dpi), caption
