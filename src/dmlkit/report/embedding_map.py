"""2-D picture of test embeddings coloured and named by test class; training-class proxies in neutral grey."""

from __future__ import annotations

import colorsys

import numpy as np

from dmlkit.exceptions import ConfigError
from dmlkit.report.figures import MIN_FONT_PT, new_figure, style_axes
from dmlkit.report.run_reader import TestEmbeddings

EMBEDDING_METHODS = ("pca", "tsne", "umap")


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


PROXY_COLOR = "#6e7781"  # neutral grey: proxies belong to training classes, absent from the test set
MAX_LEGEND_CLASSES = 12  # beyond this, class names sit beside their cluster centres


def umap_2d(points: np.ndarray, extra: np.ndarray | None, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
    """UMAP of ``points`` [N, D]; ``extra`` [P, D] placed by the fitted map's ``transform``."""
    try:
        import umap
    except ImportError:
        raise ConfigError("The embedding map method 'umap' needs the umap-learn package, which is not "
                          "installed (pip install umap-learn); use 'pca' or 'tsne'.") from None
    if points.shape[0] < 5:
        return pca_2d(points, extra)
    reducer = umap.UMAP(n_components=2, random_state=seed, n_neighbors=min(15, points.shape[0] - 1))
    coords = reducer.fit_transform(points.astype(np.float32))
    return coords, (None if extra is None else reducer.transform(extra.astype(np.float32)))


def hex_color(rgb) -> str:
    """``#rrggbb`` of an RGB triple in [0, 1]."""
    return "#" + "".join(f"{round(255 * float(v)):02x}" for v in rgb[:3])


def embedding_map_figure(
    data: TestEmbeddings,
    *,
    method: str = "pca",
    max_points: int = 2000,
    seed: int = 0,
    proxies: bool = True,
):
    """Scatter of the test embeddings in 2-D coloured by test class (named); returns (figure, caption, data).

    2-D embeddings are drawn as they are; wider ones are reduced by PCA, t-SNE or UMAP after a seeded
    subsample of at most ``max_points`` rows. Proxies belong to training classes, which the test set
    never contains, so they are drawn hollow in one neutral grey (never in a test-class colour) and
    only those inside the test points' range; ``data`` holds the colours used, for checks.
    """
    index = subsample_indices(data.labels.shape[0], max_points, seed)
    points = data.embeddings[index]
    labels = data.labels[index]
    proxy_points = data.proxies if proxies else None
    dim = points.shape[1]
    if dim == 2:
        coords = points.astype(np.float64)
        proxy_coords = None if proxy_points is None else proxy_points.astype(np.float64)
        how = "the 2-D embeddings themselves"
    elif method == "tsne":
        coords, proxy_coords = tsne_2d(points, proxy_points, seed)
        how = f"t-SNE of the {dim}-D embeddings"
    elif method == "umap":
        coords, proxy_coords = umap_2d(points, proxy_points, seed)
        how = f"UMAP of the {dim}-D embeddings"
    else:
        coords, proxy_coords = pca_2d(points, proxy_points)
        how = f"PCA (first two principal axes) of the {dim}-D embeddings"
    colors = class_colors(labels)
    classes = np.unique(labels)
    fig = new_figure(7.5, 6.8 if classes.size <= MAX_LEGEND_CLASSES else 6.2)
    ax = fig.subplots()
    point_colors = np.array([colors[int(c)] for c in labels]).reshape(-1, 3)
    size = 16 if len(index) <= 500 else 6
    ax.scatter(coords[:, 0], coords[:, 1], c=point_colors, s=size, alpha=0.75, linewidths=0)
    low, high = data_limits(coords)
    inside = outside = 0
    if proxy_coords is not None:
        within = ((proxy_coords >= low) & (proxy_coords <= high)).all(axis=1)
        inside, outside = int(within.sum()), int((~within).sum())
        ax.scatter(proxy_coords[within, 0], proxy_coords[within, 1], s=70, marker="D", facecolors="none",
                   edgecolors=PROXY_COLOR, linewidths=1.3, zorder=3, label="training-class proxies")
    names = {int(c): data.label_name(int(c)) for c in classes}
    if classes.size <= MAX_LEGEND_CLASSES:
        for c in classes:
            ax.scatter([], [], color=colors[int(c)], s=30, label=names[int(c)])
    else:  # names beside the cluster centres (the mean of each class's points)
        for c in classes:
            centre = coords[labels == c].mean(axis=0)
            ax.annotate(names[int(c)], centre, fontsize=MIN_FONT_PT, ha="center", va="center",
                        color=hex_color(colors[int(c)]), fontweight="bold",
                        bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.6))
    handles = ax.get_legend_handles_labels()[0]
    if handles:
        fig.legend(loc="outside lower center", ncols=3 if classes.size > 4 else 2, fontsize=MIN_FONT_PT,
                   frameon=False)
    ax.set_xlim(low[0], high[0])
    ax.set_ylim(low[1], high[1])
    axis_word = {"pca": "principal axis", "tsne": "t-SNE axis", "umap": "UMAP axis"}.get(method, "axis")
    if dim == 2:
        axis_word = "embedding dimension"
    style_axes(ax, f"{axis_word} 1", f"{axis_word} 2", "Test embeddings by class")
    caption = (
        f"{len(index)} of {data.labels.shape[0]} test points"
        + (f" (seeded subsample, seed {seed})" if len(index) < data.labels.shape[0] else "")
        + f", {classes.size} test classes, {how}"
        + (f"; {inside} training-class proxies inside the test points' range drawn as hollow grey diamonds"
           if proxy_coords is not None else "")
        + (f" ({outside} more lie outside it and are not drawn)" if outside else "")
        + "."
    )
    data_attributes = {"class-colors": " ".join(sorted({hex_color(v) for v in colors.values()})),
                       "proxy-color": PROXY_COLOR if proxy_coords is not None else ""}
    return fig, caption, data_attributes
