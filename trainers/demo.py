"""The demo behind `make demo`: prepare data, train DARE and TWIN, compare, export, serve.

1. writes a planted synthetic Taobao-format log (data.synthetic) and prepares
   it and the real Taobao sample from ../shared/data (data.prepare);
2. trains DARE and TWIN briefly on both (one seed) and prints a Table-1-shaped
   comparison, beside the AUC the synthetic generator makes reachable;
3. exports the DARE run as a TF Serving SavedModel, starts the test stand-in
   server and sends one gRPC request through serving.client.

Usage: python -m trainers.demo [--work_dir=runs/demo]
"""

import json
import os

from absl import app, flags

from dare_tf.experiments import reproduce
from dare_tf.export import export_run
from dare_tf.training import TrainConfig, make_strategy
from data.protocol import Protocol, prepare
from data.synthetic import SyntheticConfig, write
from serving.client import ServingClient
from serving.testing.server import serve

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
flags.DEFINE_string("work_dir", os.path.join(REPO, "runs", "demo"), "Where runs and exports go.")
flags.DEFINE_string("taobao_sample", os.path.join(os.path.dirname(REPO), "shared", "data", "taobao",
                                                  "UserBehavior_sample.csv"), "The real Taobao sample.")
flags.DEFINE_integer("synthetic_users", 2000, "Users of the synthetic log.")


def main(argv):
    del argv
    strategy = make_strategy("default")
    prepared = os.path.join(REPO, "data", "prepared")
    synthetic_log = os.path.join(REPO, "data", "synthetic", "demo.csv")
    print("== 1. data", flush=True)
    truth = write(SyntheticConfig(users=FLAGS.synthetic_users, seed=0), synthetic_log)
    data_dirs = [os.path.join(prepared, "synthetic")]
    prepare("taobao", synthetic_log, data_dirs[0], Protocol(max_len=100))
    if os.path.exists(FLAGS.taobao_sample):
        data_dirs.append(os.path.join(prepared, "taobao_sample"))
        prepare("taobao", FLAGS.taobao_sample, data_dirs[1], Protocol())
    else:
        print(f"(skipping the real sample: {FLAGS.taobao_sample} not found)")
    print(f"synthetic log: {truth['rows']} rows; the generator's own next-click probability scores "
          f"test AUC {truth['generator_auc']:.3f} (a reference point, see data/synthetic.py)")

    print("== 2. DARE vs TWIN", flush=True)

    def config_for(model, dim):
        return TrainConfig(preset=model, batch_size=512, eval_batch_size=2048, epochs=1, eval_every=60,
                           learning_rate=0.005, model_overrides=dict(embedding_dim=dim, top_k=20))

    reproduce(data_dirs, ["dare", "twin"], [16], FLAGS.work_dir, config_for, strategy)

    print("== 3. export and serve", flush=True)
    run_dir = os.path.join(FLAGS.work_dir, "synthetic", "d16", "dare")
    export_base = os.path.join(FLAGS.work_dir, "exports")
    version_dir = export_run(run_dir, export_base, "dare")
    print(f"exported {version_dir}")
    server, port, _ = serve(os.path.dirname(version_dir), "dare", 0)
    try:
        client = ServingClient(f"localhost:{port}", "dare")
        out = client.explain([101, 102], [3, 3], [[101, 57, 102, 9], [5]], [[3, 7, 3, 1], [2]])
        print("gRPC explain:", json.dumps({k: v.round(4).tolist() for k, v in out.items()}))
    finally:
        server.stop(0)
    print(f"done: tables in {FLAGS.work_dir}/table1.md, model in {version_dir}")


def run():
    app.run(main)


if __name__ == "__main__":
    run()
