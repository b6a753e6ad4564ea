"""A gallery exported to Qdrant (local mode, a folder): the same neighbours as the flat index, the model
and size checked, resumable without duplicates, retries, and clear errors for no answer and a full disk."""

from __future__ import annotations

import socket
import sqlite3
import sys

import numpy as np
import pytest

from dmlkit.core.extras import MissingExtraError
from dmlkit.exceptions import ConfigError, DatabaseError, DataError, StorageError
from dmlkit.index import Index
from dmlkit.index.database import QdrantCollection, parse_uri

FINGERPRINT = {"config": "abc", "weights": "123"}


def clustered(n, dim, seed):
    """``n`` vectors around 8 centres: neighbours are well defined but not trivially far apart."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(8, dim))
    return (centres[rng.integers(0, 8, n)] + 0.5 * rng.normal(size=(n, dim))).astype(np.float32)


def gallery_index(n=150, dim=16, fingerprint=FINGERPRINT, seed=0):
    x = clustered(n, dim, seed)
    return Index.from_embeddings(x, labels=[f"c{i % 5}" for i in range(n)], paths=[f"img/{i}.jpg" for i in range(n)],
                                 fingerprint=fingerprint, run_dir="runs/a")


def points(uri):
    """Every point id in the collection (scrolled), to count duplicates."""
    with QdrantCollection(uri) as c:
        ids, offset = [], None
        while True:
            batch, offset = c.client.scroll(c.name, limit=100, offset=offset, with_payload=False, with_vectors=False)
            ids += [int(p.id) for p in batch]
            if offset is None:
                return ids


def test_queries_through_the_database_find_the_flat_index_neighbours(tmp_path):
    index = gallery_index()
    index.remove([3, 7])  # ids with gaps: the point id is the item's id, not its row
    uri = f"qdrant:{tmp_path / 'db'}?collection=pets"
    with QdrantCollection(uri) as c:
        summary = c.export_index(index, batch_size=40)
        assert (summary.written, summary.already, summary.total) == (148, 0, 148)
        queries = clustered(25, 16, seed=1)
        got = c.query_embeddings(queries, k=10, exact=True)
    want = index.query_embeddings(queries, k=10)
    recall = np.mean([len(set(g) & set(w)) / 10 for g, w in zip(got.ids.tolist(), want.ids.tolist())])
    assert recall == 1.0
    np.testing.assert_allclose(got.scores, want.scores, atol=1e-5)
    np.testing.assert_allclose(got.distances, want.distances, atol=1e-5)
    row = int(got.ids[0, 0])
    assert got.paths[0][0] == f"img/{row}.jpg" and got.labels[0][0] == f"c{row % 5}" and got.match is None


def test_another_model_or_size_is_refused_and_the_header_kept(tmp_path):
    uri = f"qdrant:{tmp_path / 'db'}"
    with QdrantCollection(uri) as c:
        c.export_index(gallery_index(n=50))
    with QdrantCollection(uri) as c, pytest.raises(ConfigError, match="written by another model"):
        c.export_index(gallery_index(n=50, fingerprint={"config": "other", "weights": "123"}))
    with QdrantCollection(uri) as c, pytest.raises(DataError, match="size 16, these are of size 8"):
        c.export_index(gallery_index(n=50, dim=8))

    class OtherModel:
        fingerprint = {"config": "other", "weights": "9"}

    with QdrantCollection(uri) as c:
        with pytest.raises(ConfigError, match="written by another model"):
            c.check_model(OtherModel())
        with pytest.raises(DataError, match="query embeddings have size 8"):
            c.query_embeddings(np.ones((1, 8), np.float32))
        assert c.header()["fingerprint"] == FINGERPRINT and len(c) == 50


def test_an_interrupted_export_continues_without_duplicates_or_re_embedding(tmp_path, monkeypatch):
    uri = f"qdrant:{tmp_path / 'db'}"
    index = gallery_index(n=120)
    asked = []

    def vectors_of(rows):
        asked.extend(rows.tolist())
        return index.vectors()[rows]

    def export(c):
        return c.export(index.ids, index.paths, index.labels, vectors_of, dim=16, fingerprint=FINGERPRINT, batch_size=30)

    with QdrantCollection(uri) as c:
        upsert, calls = c.client.upsert, []

        def cut_after_two(*args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt  # Ctrl-C (or a killed process) in the third batch
            return upsert(*args, **kwargs)

        monkeypatch.setattr(c.client, "upsert", cut_after_two)
        with pytest.raises(KeyboardInterrupt):
            export(c)
    assert sorted(points(uri)) == list(range(60))
    asked.clear()
    with QdrantCollection(uri) as c:
        summary = export(c)
    assert (summary.written, summary.already, summary.total) == (60, 60, 120)
    assert sorted(asked) == list(range(60, 120))  # only the items not written were embedded again
    ids = points(uri)
    assert len(ids) == len(set(ids)) == 120

    changed = list(index.paths)
    changed[5] = "img/other.jpg"
    with QdrantCollection(uri) as c, pytest.raises(DataError, match="the gallery changed since the earlier export"):
        c.export(index.ids, changed, index.labels, vectors_of, dim=16, fingerprint=FINGERPRINT)


def test_a_request_that_fails_once_is_retried(tmp_path, monkeypatch):
    from qdrant_client.http.exceptions import ResponseHandlingException

    uri = f"qdrant:{tmp_path / 'db'}"
    with QdrantCollection(uri, retries=3, retry_wait=0.0) as c:
        upsert, failures = c.client.upsert, []

        def flaky(*args, **kwargs):
            if len(failures) < 2:
                failures.append(1)
                raise ResponseHandlingException(ConnectionResetError("connection reset by peer"))
            return upsert(*args, **kwargs)

        monkeypatch.setattr(c.client, "upsert", flaky)
        assert c.export_index(gallery_index(n=40)).total == 40 and len(failures) == 2


def test_a_server_that_does_not_answer_is_a_clear_error(tmp_path):
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with QdrantCollection(f"http://127.0.0.1:{port}?collection=pets", retries=2, retry_wait=0.0, timeout=2.0) as c:
        with pytest.raises(DatabaseError, match=rf"collection 'pets' at http://127.0.0.1:{port} did not answer .* "
                                                r"after 2 tries") as caught:
            c.export_index(gallery_index(n=10))
    assert isinstance(caught.value, ConnectionError)


def test_a_full_disk_stops_the_export_with_what_was_written_kept(tmp_path, monkeypatch):
    from qdrant_client.local.persistence import CollectionPersistence

    uri = f"qdrant:{tmp_path / 'db'}"
    index = gallery_index(n=60)
    persist, stored = CollectionPersistence.persist, []

    def fills_up(self, point):
        if len(stored) == 35:
            raise sqlite3.OperationalError("database or disk is full")
        stored.append(point.id)
        return persist(self, point)

    monkeypatch.setattr(CollectionPersistence, "persist", fills_up)
    with QdrantCollection(uri) as c, pytest.raises(StorageError, match="disk is full .* The 25 items written before"):
        c.export_index(index, batch_size=25)
    monkeypatch.undo()
    assert sorted(points(uri)) == list(range(35))  # the full batch and the part of the next one that was stored
    with QdrantCollection(uri) as c:
        assert c.export_index(index, batch_size=25).total == 60
    assert sorted(points(uri)) == list(range(60))


def test_uris_and_the_missing_extra():
    assert parse_uri("qdrant:db").path.endswith("/db") and parse_uri("qdrant:db").collection == "dmlkit"
    server = parse_uri("qdrant://example.org:6333?collection=pets")
    assert (server.url, server.collection, server.local) == ("http://example.org:6333", "pets", False)
    assert parse_uri("https://example.org").url == "https://example.org"
    for bad in ("pets.index", "qdrant:", "http://", "qdrant:db?name=x"):
        with pytest.raises(ConfigError):
            parse_uri(bad)


def test_a_missing_qdrant_client_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "qdrant_client", None)  # import fails as when the package is absent
    with pytest.raises(MissingExtraError, match=r'pip install "dmlkit\[qdrant\]"'):
        QdrantCollection(f"qdrant:{tmp_path / 'db'}")


def test_a_local_path_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "db").write_text("mine")
    with pytest.raises(ConfigError, match="is a file; qdrant:PATH names a folder"):
        QdrantCollection(f"qdrant:{tmp_path / 'db'}")
    assert (tmp_path / "db").read_text() == "mine"
