"""The package's shape: no import cycle among dare_tf's modules (function-local imports
included), no module over 300 lines, the model module free of TensorFlow, and no
search variant named outside the search family."""

import ast
import os
import re

import pytest

from tests.conftest import REPO, USER_ENV

PACKAGE = os.path.join(REPO, "dare_tf")


def _modules() -> dict[str, str]:
    """Module name -> path of every module of dare_tf."""
    out = {}
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                parts = os.path.relpath(path, REPO)[:-3].split(os.sep)
                out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: str, modules) -> set[str]:
    """The dare_tf modules `name` imports anywhere in its source (functions included)."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    # Importing dare_tf.a.b first runs dare_tf.a's __init__: an edge to every parent package
    # but the root (which every module has) and the importer's own packages.
    for target in list(found):
        parts = target.split(".")
        found.update(parent for parent in (".".join(parts[:i]) for i in range(2, len(parts)))
                     if parent in modules and parent != name and not name.startswith(parent + "."))
    return found


def _cycle(graph):
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph["dare_tf.model.dare_model"] and graph["dare_tf.export"]  # the walk sees imports
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_packages_and_top_level_modules_import_each_other_in_one_direction():
    """Issues 46 and 66 (4): between dare_tf's subpackages (data, layers, search, model,
    training, retrieval, analysis, export, serving, histories, ...) and its top-level
    modules, each a unit, no import loop, function-local imports included: the layers
    and the search family sit below the model (`BehaviorField` below the layers), the
    model below the stages, reranking and run directories below those."""
    modules = _modules()
    graph: dict[str, set] = {}
    for name, path in modules.items():
        unit = name.split(".")[1] if name.count(".") else None
        if unit is None:
            continue
        graph.setdefault(unit, set()).update(
            other for other in (i.split(".")[1] for i in _imports(name, path, modules) if i.count("."))
            if other != unit)
    assert {"layers", "search", "model"} <= graph["model"] | {"model"} and graph["training"]  # the walk sees them
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_graph_has_the_parent_package_edge():
    """`dare_tf.search.base` imports `dare_tf.layers.pooling`, so the `dare_tf.layers`
    package (whose __init__ imports every layer) runs first."""
    modules = _modules()
    assert "dare_tf.layers" in _imports("dare_tf.search.base", modules["dare_tf.search.base"], modules)


def test_no_private_model_internals_outside_the_model():
    """Analyses, benchmarks, examples and tests read the model through its public
    methods (`example_ids`, `embeddings`, `search_stage`), not `_unpack`."""
    pattern = re.compile(r"\._unpack\w*\(")
    offenders = [f"{os.path.relpath(os.path.join(root, f), REPO)}:{i}"
                 for top in ("dare_tf", "tests", "benchmarks", "examples", "trainers", "serving", "data")
                 for root, _, files in os.walk(os.path.join(REPO, top)) for f in files if f.endswith(".py")
                 if os.path.join(root, f) != os.path.join(PACKAGE, "model", "dare_model.py")
                 for i, line in enumerate(open(os.path.join(root, f)), 1)
                 if pattern.search(line) and "pattern" not in line]
    assert offenders == []


def test_a_planted_cycle_is_found():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("name,path", sorted(_modules().items()))
def test_no_module_over_300_lines(name, path):
    """Issue 46: a module holds one concept; none is over 300 lines."""
    assert sum(1 for _ in open(path)) <= 300, name


def test_the_model_module_imports_no_tensorflow():
    tree = ast.parse(open(os.path.join(PACKAGE, "model", "dare_model.py")).read())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not {m for m in imported if m.split(".")[0] == "tensorflow"}, imported


def test_no_search_variant_is_named_outside_the_search_family():
    from dare_tf.search import SEARCHES

    names = "|".join(re.escape(n) for n in SEARCHES)
    # A comparison of `search` (a config field, a flag, a mode) with a variant's name.
    pattern = re.compile(rf"search\w*\s*(==|!=|\bin\b|\bnot in\b)\s*[\(\[\{{]?\s*[\"']({names})[\"']"
                         rf"|[\"']({names})[\"']\s*(==|!=)\s*\w*search")
    offenders = [f"{os.path.relpath(path, REPO)}:{i}" for name, path in _modules().items()
                 if not name.startswith("dare_tf.search")
                 for i, line in enumerate(open(path), 1) if pattern.search(line)]
    assert offenders == []
    assert pattern.search('if cfg.search == "sdim":') and pattern.search("search in ('soft', 'hard')")


# Where a module outside the trainer's engines (dare_tf/training/engines/) names Keras's backend,
# and why: a kernel or an execution only one backend has, or a start-up that must not load the other.
BACKEND_CHOICES = {
    "dare_tf/__init__.py": "dare_tf.load() registers the optimizers only TensorFlow has",
    "dare_tf/_on_tensorflow.py": "what only TensorFlow does (the export, the retrieval stage), from another backend",
    "dare_tf/_startup.py": "a program's start-up: TensorFlow loaded quietly, or hidden on another backend",
    "dare_tf/cli.py": "a program's start-up skips the imports its backend does not use",
    "dare_tf/analysis/dimensions.py": "the dimension analysis times a stage as a tf.function on TensorFlow",
    "dare_tf/layers/embedding_tables.py": "the tables' gradient kernel (sparse rows), one per backend",
    "dare_tf/layers/pooling.py": "the pooling kernel on JAX",
    "dare_tf/model/dare_model.py": "the first pass that builds the weights, and the table lookups on TensorFlow",
    "dare_tf/model/training.py": "the train step as one XLA function on TensorFlow",
}


def test_only_the_engines_ask_which_backend():
    """Issue 66 (1): the backend is Keras's, chosen once (`KERAS_BACKEND`) and asked by
    the trainer's engines (`dare_tf.training.engines`) alone, and where a kernel or an
    execution only one backend has is chosen (`BACKEND_CHOICES`, each with its reason):
    no other module and no program asks; the rest of the trainer (dare_tf/training/
    outside the engines) and the programs on it import neither backend's library nor name
    one, and build no strategy; `train` takes none."""
    import inspect

    from dare_tf.training import train

    asks = re.compile(r"keras\.backend\.backend\(\)|configured_backend\(\)"
                      r"|backend\w*\s*[=!]=\s*[\"'](jax|tensorflow|torch)[\"']")
    names = re.compile(r"[\"'](jax|tensorflow)[\"']|^\s*(import|from) (jax|tensorflow)\b|make_strategy")
    engines = os.path.join("dare_tf", "training", "engines")
    # (where nothing names a backend: the trainer outside its engines, and the programs on it)
    plain = (os.path.join("dare_tf", "training"), "trainers", os.path.join("dare_tf", "experiments.py"),
             os.path.join("dare_tf", "demo.py"), os.path.join("dare_tf", "export", "__init__.py"),
             os.path.join("dare_tf", "analysis", "suite.py"))
    asking, naming = [], []
    for top in ("dare_tf", "trainers", "serving", "data"):
        for root, _, files in os.walk(os.path.join(REPO, top)):
            for f in sorted(files):
                path = os.path.relpath(os.path.join(root, f), REPO)
                if not f.endswith(".py") or path.startswith(engines):
                    continue
                for i, line in enumerate(open(os.path.join(REPO, path)), 1):
                    if asks.search(line) and path not in BACKEND_CHOICES:
                        asking.append(f"{path}:{i}")
                    if path.startswith(plain) and names.search(line):
                        naming.append(f"{path}:{i}")
    assert asking == [] and naming == []
    assert all(any(asks.search(line) for line in open(os.path.join(REPO, path))) for path in BACKEND_CHOICES)
    assert "strategy" not in inspect.signature(train).parameters
    assert asks.search('if keras.backend.backend() == "jax":') and asks.search("backend != 'tensorflow'")
    assert names.search("import tensorflow as tf") and names.search("    from jax import numpy")
    assert not names.search("# tf.data, not jax_loop") and not asks.search('if name == "tensorflow":')


def test_the_serving_client_and_the_stand_in_load_no_model_stack():
    """The gRPC client, the two-stage Recommender and the stand-in read the TF Serving
    conventions from `dare_tf.signatures`: importing them (as the programs do, with
    imports deferred) loads neither the model nor the export package."""
    import subprocess
    import sys

    code = ("import sys; import dare_tf.serving.client, dare_tf.serving.recommender, dare_tf.testing.standin_server, "
            "dare_tf.serving.inspect; "
            "print(sorted(m for m in sys.modules if m == 'dare_tf.model.dare_model' or "
            "m.startswith('dare_tf.export')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(USER_ENV, TF_CPP_MIN_LOG_LEVEL="3"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


PROGRAMS = ["trainers.train", "trainers.train_retrieval", "trainers.reproduce", "trainers.evaluate_cascade",
            "trainers.analyze", "trainers.demo", "serving.export", "serving.client", "serving.standin_server",
            "serving.histories", "serving.inspect", "data.prepare", "data.synthetic"]


def test_imports_set_no_environment_variable_and_touch_no_file_descriptor():
    """`import dare_tf` (and its data and client packages, and every program's
    module) has one personality: it sets no environment variable, redirects no
    file descriptor, loads no TensorFlow, Keras or JAX; and no `DARE_TF_*` switch
    is left in the code."""
    import subprocess
    import sys

    modules = ["dare_tf", "dare_tf.data", "dare_tf.serving", "dare_tf.training", "dare_tf.retrieval",
               "dare_tf.search", "dare_tf.analysis", "dare_tf.histories"]
    code = ("import importlib, json, os, sys\n"
            "if sys.argv[1] == 'tensorflow':  # imported first: what TensorFlow's own import sets is not ours\n"
            "    import tensorflow\n"
            "before = (dict(os.environ), os.fstat(1).st_ino, os.fstat(2).st_ino)\n"
            "for name in sys.argv[1:]:\n"
            "    importlib.import_module(name)\n"
            "after = (dict(os.environ), os.fstat(1).st_ino, os.fstat(2).st_ino)\n"
            "changed = sorted(k for k in set(before[0]) | set(after[0]) if before[0].get(k) != after[0].get(k))\n"
            "print(json.dumps({'environ': changed, 'fds': before[1:] == after[1:], "
            "'loaded': sorted(m for m in ('tensorflow', 'keras', 'jax') if m in sys.modules)}))\n")
    import json

    # The gRPC client needs TensorFlow's protos (tensorflow-serving-api's depend on them): TensorFlow
    # (which imports Keras itself) first, then the client changes nothing more and loads no model.
    groups = [modules, ["tensorflow", "dare_tf.serving.client"]] + [[p] for p in PROGRAMS]  # (programs' flags clash)
    for group in groups:
        done = subprocess.run([sys.executable, "-c", code, *group], cwd=REPO, capture_output=True, text=True,
                              timeout=120, env={k: v for k, v in USER_ENV.items() if k != "TF_CPP_MIN_LOG_LEVEL"})
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        expected = ["jax", "keras", "tensorflow"] if group[0] == "tensorflow" else []
        assert report == {"environ": [], "fds": True, "loaded": expected}, group
    switches = [f"{os.path.relpath(os.path.join(root, f), REPO)}:{i}"
                for top in ("dare_tf", "trainers", "serving", "data")
                for root, _, files in os.walk(os.path.join(REPO, top))
                for f in files if f.endswith(".py")
                for i, line in enumerate(open(os.path.join(root, f)), 1) if "DARE_TF_" in line]
    assert switches == []


# Modules whose behaviour is tested in a file named for a larger unit than the module
# (module -> that file). Every other module of dare_tf with code of its own has its mirror:
# dare_tf/a/b.py -> tests/a/test_b.py (a leading underscore dropped).
TESTED_WITH = {
    # The engines (dare_tf.training.engines), tested through the trainer on each backend:
    "dare_tf.training.engines.choice": "tests/training/test_engines.py",
    "dare_tf.training.engines.jax.loop": "tests/training/test_jax_loop.py",
    "dare_tf.training.engines.jax.state": "tests/training/test_jax_loop.py",  # checkpoints and resume
    "dare_tf.training.engines.jax.distribution": "tests/training/test_jax_distribution.py",
    "dare_tf.training.engines.jax.device_input": "tests/training/test_device_input.py",
    "dare_tf.training.engines.tensorflow.loop": "tests/training/test_loop.py",
    "dare_tf.training.engines.tensorflow.input": "tests/training/test_loop.py",  # the training stream from any step
    "dare_tf.training.engines.tensorflow.distribution": "tests/training/test_distribution.py",
    "dare_tf.training.engines.tensorflow.evaluator": "tests/training/test_evaluation.py",
    "dare_tf.training.engines.tensorflow.prediction": "tests/training/test_evaluation.py",
    "dare_tf.training.seeds": "tests/training/test_loop.py",  # the run over seeds, on both backends' trainers
    "dare_tf.training.seed_run": "tests/training/test_jax_loop.py",  # one seed's run, through both engines' runs
    "dare_tf.training.workers": "tests/training/test_distribution.py",
    "dare_tf.training.trainer": "tests/training/test_jax_loop.py",  # (and every TensorFlow training test)
    "dare_tf._startup": "tests/test_programs.py",  # the programs' quieted start-up
    "dare_tf._api": "tests/test_faces.py",  # the generated faces, against their declarations
    "dare_tf._api_gen": "tests/test_faces.py",
    "dare_tf.analysis.config": "tests/analysis/test_suite.py",
    "dare_tf.analysis.convergence": "tests/analysis/test_suite.py",
    "dare_tf.analysis.dimensions": "tests/analysis/test_suite.py",
    "dare_tf.analysis.figures": "tests/analysis/test_suite.py",
    "dare_tf.analysis.report": "tests/analysis/test_suite.py",
    "dare_tf.analysis.runs": "tests/analysis/test_suite.py",  # the runs the suite loads and computes over
    "dare_tf.cli": "tests/test_programs.py",
    "dare_tf.model.config": "tests/model/test_dare_model.py",
    "dare_tf.layers.behavior_fields": "tests/layers/test_embedding_tables.py",  # a field's tables and refusals
    "dare_tf.data.preparation.beam": "tests/data/preparation/test_prepare.py",
    "dare_tf.data.preparation.beam_shards": "tests/data/preparation/test_prepare.py",
    "dare_tf.data.preparation.catalogue": "tests/data/preparation/test_days.py",
    # (the directory's guard; its lock: tests/data/preparation/test_append.py)
    "dare_tf.data.preparation.dataset_dir": "tests/data/preparation/test_prepare.py",
    "dare_tf.data.logs.blocks": "tests/data/logs/test_formats.py",  # bad lines named or skipped, per block
    "dare_tf.data.logs.reader": "tests/data/logs/test_formats.py",
    "dare_tf.data.logs.parquet": "tests/data/logs/test_formats.py",  # (Parquet logs, through the log reader)
    "dare_tf.data.feeding.pipeline": "tests/data/storage/test_records.py",
    "dare_tf.data.preparation.prepared": "tests/data/preparation/test_prepare.py",
    "dare_tf.data.preparation.protocol": "tests/data/preparation/test_prepare.py",
    "dare_tf.data.preparation.in_memory": "tests/data/preparation/test_prepare.py",
    "dare_tf.data.preparation.journal": "tests/data/preparation/test_append.py",  # killed appends, recovered
    "dare_tf.data.storage.schema": "tests/data/storage/test_records.py",
    "dare_tf.data.storage.shards": "tests/data/storage/test_records.py",
    "dare_tf.data.storage.spec": "tests/data/storage/test_records.py",
    "dare_tf.data.storage.store": "tests/data/preparation/test_prepare.py",
    "dare_tf.data.generation.like_presets": "tests/data/generation/test_lifelike.py",  # the real logs' counts
    "dare_tf.demo": "tests/test_programs.py",
    "dare_tf.export.retrieval": "tests/serving/test_recommender.py",
    "dare_tf.export.rows": "tests/export/test_rank.py",  # each row's own error, alone and merged
    "dare_tf.export.user_major": "tests/export/test_rank.py",  # the rank signature's rows
    "dare_tf.histories.base": "tests/histories/test_stores.py",
    "dare_tf.histories.lmdb_store": "tests/histories/test_stores.py",
    "dare_tf.histories.prepared": "tests/histories/test_stores.py",
    "dare_tf.histories.redis_store": "tests/histories/test_stores.py",
    "dare_tf.layers.clustering": "tests/search/test_cluster.py",
    "dare_tf.layers.head": "tests/test_keras_models.py",
    "dare_tf.model.inputs": "tests/model/test_dare_model.py",
    "dare_tf.model.training": "tests/model/test_execution.py",
    "dare_tf.model.serving": "tests/model/test_dare_model.py",  # rank_forward equals forward per pair; explain
    "dare_tf.model.presets": "tests/model/test_dare_model.py",  # every preset built and trained
    "dare_tf.retrieval._keras2": "tests/retrieval/test_training.py",
    "dare_tf.retrieval.config": "tests/retrieval/test_training.py",
    "dare_tf.retrieval.evaluation": "tests/retrieval/test_candidates.py",  # recall per quota, bounded batches
    "dare_tf.retrieval.verdict": "tests/retrieval/test_cascade.py",
    "dare_tf.search.base": "tests/search/test_contract.py",
    "dare_tf.search.full_history": "tests/search/test_contract.py",
    "dare_tf.search.hard": "tests/search/test_top_k.py",
    "dare_tf.search.soft": "tests/search/test_top_k.py",
    "dare_tf.serving.rest": "tests/serving/test_client.py",  # REST through the stand-in
    "dare_tf.signatures": "tests/export/test_ranker.py",
    "dare_tf.testing.browser": "tests/serving/test_inspect.py",  # drives the inspect page in Chromium
    "dare_tf.testing.loaded_model": "tests/testing/test_standin_server.py",  # versions switched, requests checked
    "dare_tf.testing.model_config": "tests/export/test_tf_serving.py",  # the configs the export writes, read back
    "dare_tf.testing.redis_server": "tests/histories/test_stores.py",
    "dare_tf.testing.redis_cluster": "tests/histories/test_cluster_store.py",
    "dare_tf.testing.requests": "tests/testing/test_rest.py",
    "dare_tf.training.input_plan": "tests/training/test_loop.py",
    "dare_tf.training.progress": "tests/training/test_callbacks.py",
    "dare_tf.training.program_flags": "tests/test_programs.py",  # the trainers' --help and flag errors
    "dare_tf.training.reranking": "tests/retrieval/test_cascade.py",
    "dare_tf.reranking": "tests/retrieval/test_cascade.py",
    "dare_tf.training.sections": "tests/training/test_config.py",
    "dare_tf.tensorboard_events": "tests/training/test_loop.py",  # (read back with TensorBoard's EventAccumulator)
}


def _mirror(name: str) -> str:
    parts = name.split(".")[1:]
    return os.path.join("tests", *parts[:-1], f"test_{parts[-1].lstrip('_')}.py")


def test_every_module_has_its_test_file():
    """Each module of dare_tf with code of its own (not a package's face) has its mirrored
    test file, or the file that tests it with a larger unit is named in TESTED_WITH."""
    missing, stale = [], []
    for name, path in sorted(_modules().items()):
        if path.endswith("__init__.py"):
            continue
        mirror = os.path.exists(os.path.join(REPO, _mirror(name)))
        if name in TESTED_WITH:
            if mirror or not os.path.exists(os.path.join(REPO, TESTED_WITH[name])):
                stale.append(name)
        elif not mirror:
            missing.append(f"{name} -> {_mirror(name)}")
    assert not missing and not stale, (missing, stale)


def test_signature_names_are_spelt_only_in_the_signatures_module():
    """Issue 46: the exports, the client, the stand-in and the programs name a
    signature through `dare_tf.signatures`, never as a string of their own."""
    from dare_tf import signatures

    names = [signatures.SERVING_DEFAULT, signatures.RANK, signatures.RANK_EXPLAIN, signatures.ITEM_FIELDS,
             signatures.CLASSIFY, signatures.REGRESS, signatures.PREDICT_METHOD, signatures.CLASSIFY_METHOD,
             signatures.REGRESS_METHOD]
    found = []
    for top in ("dare_tf", "serving", "trainers", "data"):
        for root, _, files in os.walk(os.path.join(REPO, top)):
            for name in files:
                path = os.path.join(root, name)
                if not name.endswith(".py") or path == signatures.__file__:
                    continue
                with open(path) as f:
                    text = f.read()
                found += [f"{os.path.relpath(path, REPO)}: {n!r}" for n in names
                          if f'"{n}"' in text or f"'{n}'" in text]
    assert found == []
