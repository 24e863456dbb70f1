"""Which training samples each client gets: the index assignment behind every partition scheme.

`split_indices` takes the training labels and returns, per client, the sorted indices it holds plus a small
JSON-able description (its classes, the draws it took). Every index goes to exactly one client. All
randomness comes from the Generator passed in, so a seed fixes the result. docs/algorithms.md section 8 and
pFedLA's non-IID 1 and 2 (section 6.3) are the references; decisions beyond them are written at each
function. This module must not know about images, files or any other Fedge package.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedge.fldata.dataset import DataError

DIRICHLET_ATTEMPTS = 1000
DOMINANT_SHARE = 0.8
LAYOUTS = ("random", "chain")

Assignment = tuple[list[np.ndarray], list[dict[str, Any]]]


def split_indices(
    labels: np.ndarray,
    num_classes: int,
    scheme: str,
    clients: int,
    rng: np.random.Generator,
    *,
    alpha: float,
    classes_per_client: int,
    dominant_classes: int,
    classes_layout: str,
    min_size: int,
) -> Assignment:
    """Per-client sorted training indices and descriptions for scheme (feature-shift splits like iid)."""
    if clients * min_size > len(labels):
        raise DataError(
            f"{clients} clients with at least {min_size} samples each need {clients * min_size} training "
            f"samples; the dataset has {len(labels)}"
        )
    if scheme in ("iid", "feature-shift"):
        parts = np.array_split(rng.permutation(len(labels)), clients)
        result: Assignment = ([np.sort(p) for p in parts], [{} for _ in parts])
    elif scheme == "dirichlet":
        result = _dirichlet(labels, num_classes, clients, rng, alpha, min_size)
    elif scheme == "classes":
        result = _classes(labels, num_classes, clients, rng, classes_per_client, classes_layout)
    elif scheme == "dominant":
        result = _dominant(labels, num_classes, clients, rng, dominant_classes)
    else:
        raise DataError(f"unknown partition scheme {scheme!r}")
    for i, idx in enumerate(result[0]):
        if len(idx) < min_size:
            raise DataError(
                f"{scheme}: client {i} would get {len(idx)} training samples, fewer than the minimum "
                f"{min_size}; use fewer clients or a smaller minimum"
            )
    return result


def _by_class(labels: np.ndarray, num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Each class's indices, shuffled."""
    return [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]


def _cut(indices: np.ndarray, proportions: np.ndarray) -> list[np.ndarray]:
    """indices split in order into len(proportions) runs whose sizes follow the proportions."""
    total = proportions.sum()
    if total <= 0:
        return [indices[:0] for _ in proportions]
    cuts = (np.cumsum(proportions / total) * len(indices)).astype(np.int64)[:-1]
    return np.split(indices, np.clip(cuts, 0, len(indices)))


def _gather(pieces: list[list[np.ndarray]]) -> list[np.ndarray]:
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in pieces]


def _dirichlet(labels: np.ndarray, num_classes: int, clients: int, rng: np.random.Generator,
               alpha: float, min_size: int) -> Assignment:
    """For each class draw q ~ Dir(alpha * 1_N) and split the class in those proportions.

    The whole draw is repeated while any client would hold fewer than min_size samples, at most
    DIRICHLET_ATTEMPTS times. Sizes are worked out before any index moves, so a retry is cheap.
    """
    sizes = np.bincount(labels, minlength=num_classes)
    attempts = 0
    while True:
        attempts += 1
        if attempts > DIRICHLET_ATTEMPTS:
            raise DataError(
                f"dirichlet: no draw in {DIRICHLET_ATTEMPTS} attempts gave every one of {clients} clients at "
                f"least {min_size} samples (alpha {alpha}); raise alpha, use fewer clients or a smaller minimum"
            )
        q = rng.dirichlet(np.full(clients, alpha), size=num_classes)
        if not np.all(np.isfinite(q)):
            continue
        cuts = (np.cumsum(q, axis=1) * sizes[:, None]).astype(np.int64)
        cuts[:, -1] = sizes
        if np.diff(cuts, axis=1, prepend=0).sum(axis=0).min() >= min_size:
            break
    pieces: list[list[np.ndarray]] = [[] for _ in range(clients)]
    for c, idx in enumerate(_by_class(labels, num_classes, rng)):
        for i, part in enumerate(np.split(idx, cuts[c, :-1])):
            pieces[i].append(part)
    meta = {"alpha": float(alpha), "attempts": attempts}
    return _gather(pieces), [dict(meta) for _ in range(clients)]


def balanced_class_sets(num_classes: int, clients: int, k: int, rng: np.random.Generator) -> list[list[int]]:
    """k distinct classes per client, chosen at random but balanced across classes.

    Each client takes the k classes held by the fewest clients so far, ties broken at random, so every
    class is held by floor or ceil of clients * k / num_classes clients, and all are held when
    clients * k >= num_classes.
    """
    holders = np.zeros(num_classes, dtype=np.int64)
    sets: list[list[int]] = []
    for _ in range(clients):
        order = np.lexsort((rng.random(num_classes), holders))
        chosen = np.sort(order[:k])
        holders[chosen] += 1
        sets.append([int(c) for c in chosen])
    return sets


def _classes(labels: np.ndarray, num_classes: int, clients: int, rng: np.random.Generator,
             k: int, layout: str) -> Assignment:
    """k classes per client; each class is shared equally among the clients that hold it.

    layout "random" uses `balanced_class_sets`; "chain" gives client i the classes i, i+1, .., i+k-1
    (mod the number of classes), so neighbouring clients share k - 1 classes (pFedLA's layout).
    """
    if not 1 <= k <= num_classes:
        raise DataError(f"classes: classes_per_client must be in 1..{num_classes}, got {k}")
    if layout == "random":
        if clients * k < num_classes:
            raise DataError(f"classes: {clients} clients x {k} classes cannot cover {num_classes} classes")
        sets = balanced_class_sets(num_classes, clients, k, rng)
    elif layout == "chain":
        if clients + k - 1 < num_classes:
            raise DataError(f"classes: a chain of {clients} clients x {k} classes cannot cover "
                            f"{num_classes} classes (needs clients + k - 1 >= classes)")
        sets = [sorted((i + j) % num_classes for j in range(k)) for i in range(clients)]
    else:
        raise DataError(f"classes: unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    pieces: list[list[np.ndarray]] = [[] for _ in range(clients)]
    for c, idx in enumerate(_by_class(labels, num_classes, rng)):
        owners = [i for i, s in enumerate(sets) if c in s]
        for i, part in zip(owners, np.array_split(idx, len(owners)), strict=True):
            pieces[i].append(part)
    metas = [{"classes": s, "classes_per_client": k, "layout": layout} for s in sets]
    return _gather(pieces), metas


def _dominant(labels: np.ndarray, num_classes: int, clients: int, rng: np.random.Generator,
              d: int) -> Assignment:
    """All classes per client, d of them dominant, together about DOMINANT_SHARE of its data.

    Client i wants a DOMINANT_SHARE / d fraction of its data from each dominant class and the rest spread
    evenly over the others; each class is split among all clients in proportion to those wants. The
    dominant sets are balanced (`balanced_class_sets`), and when every class is dominant for the same
    number of clients the shares come out exact; otherwise they are close, and each client's meta records
    the share it actually got.
    """
    if not 1 <= d < num_classes:
        raise DataError(f"dominant: dominant_classes must be in 1..{num_classes - 1}, got {d}")
    sets = balanced_class_sets(num_classes, clients, d, rng)
    want = np.full((clients, num_classes), (1.0 - DOMINANT_SHARE) / (num_classes - d))
    for i, s in enumerate(sets):
        want[i, s] = DOMINANT_SHARE / d
    pieces: list[list[np.ndarray]] = [[] for _ in range(clients)]
    for c, idx in enumerate(_by_class(labels, num_classes, rng)):
        for i, part in enumerate(_cut(idx, want[:, c])):
            pieces[i].append(part)
    shards = _gather(pieces)
    metas = []
    for s, idx in zip(sets, shards, strict=True):
        share = float(np.isin(labels[idx], s).mean()) if len(idx) else 0.0
        metas.append({"dominant_classes": s, "dominant_share": round(share, 6)})
    return shards, metas
