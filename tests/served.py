"""The serving tests' shared export: a DARE model on the Taobao sample, exported and
served by the stand-in (gRPC and REST) once per test session (its tests share the
`serving_setup` xdist group, so one worker builds it), and raw-id requests with the
Keras model's answers to compare against. A plugin of tests/conftest.py
(`pytest_plugins`), so every test module can ask for `setup`."""


import numpy as np
import pytest

from dare_tf.data.storage.id_maps import read_id_map
from tests.conftest import TAOBAO_LOG

L = 20


def sample_model(root):
    """The Taobao sample prepared at L under `root/data`, and a DARE model of its
    vocabularies whose embeddings are spread (predictions differ per request):
    `(data_dir, spec, model)`."""
    from dare_tf import build_model
    from dare_tf.data.preparation.protocol import Protocol
    from dare_tf.data.preparation.in_memory import prepare
    from dare_tf.data.storage.spec import DatasetSpec

    data_dir = str(root / "data")
    prepare("taobao", TAOBAO_LOG, data_dir,
            Protocol(max_len=L))
    spec = DatasetSpec.load(data_dir)
    model = build_model("dare", spec.num_items, spec.num_categories, max_len=L, top_k=5,
                        initializer="keras", seed=3)
    rng = np.random.default_rng(0)
    for table in model.embedding.weights:
        table.assign(rng.normal(0, 0.5, table.shape))
    return data_dir, spec, model


@pytest.fixture(scope="session")
def setup(tmp_path_factory):
    from dare_tf.export import ranker as export_lib
    from dare_tf.testing.standin_server import serve

    root = tmp_path_factory.mktemp("serving")
    data_dir, spec, model = sample_model(root)
    path = export_lib.export_saved_model(model, data_dir, str(root / "exports"), "dare")
    server, port, http = serve({"dare": str(root / "exports" / "dare")}, 0, rest_port=0)
    yield dict(root=root, data_dir=data_dir, spec=spec, model=model, path=path, port=port,
               rest=f"http://localhost:{http.server_address[1]}")
    server.stop(0)
    http.shutdown()


def raw_maps(data_dir):
    items = {int(r): i + 1 for i, r in enumerate(read_id_map(data_dir, "item"))}
    cats = {int(r): i + 1 for i, r in enumerate(read_id_map(data_dir, "category"))}
    return items, cats


def requests(data_dir, rng, n=12):
    """Raw-id requests with histories of 1, < L, = L and > L behaviours, and unknown ids."""
    items = [int(r) for r in read_id_map(data_dir, "item")]
    cats = [int(r) for r in read_id_map(data_dir, "category")]
    lengths = [1, 5, L, L + 13] * (n // 4)
    hist_items = [list(rng.choice(items, k)) for k in lengths]
    hist_cats = [list(rng.choice(cats, k)) for k in lengths]
    hist_items[1][0] = 987654321987  # unknown history item -> OOV row
    return (np.array(rng.choice(items, n)), np.array(rng.choice(cats, n)), hist_items, hist_cats)


def in_process(setup, target_items, target_cats, hist_items, hist_cats):
    """The Keras model on the same requests, raw ids mapped in numpy."""
    items, cats = raw_maps(setup["data_dir"])
    spec = setup["spec"]
    def dense_hist(histories, table, oov):
        out = np.zeros((len(histories), L), np.int64)
        for r, h in enumerate(histories):
            h = [table.get(x, oov) if x > 0 else 0 for x in h][-L:]
            out[r, L - len(h):] = h
        return out
    x = {"target_item": np.array([items.get(i, spec.oov_item) for i in target_items]),
         "target_category": np.array([cats.get(c, spec.oov_category) for c in target_cats]),
         "hist_items": dense_hist(hist_items, items, spec.oov_item),
         "hist_categories": dense_hist(hist_cats, cats, spec.oov_category)}
    return np.asarray(setup["model"](x)), setup["model"].explain(x)
