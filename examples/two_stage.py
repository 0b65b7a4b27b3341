"""Two-stage recommendation as library calls: prepare a log, train a two-tower
retrieval model (tensorflow-recommenders) and a DARE ranker on the candidates it
will rank, and evaluate the cascade (retrieval's top N, reordered by DARE).

The ranker is trained the way that wins in docs/two-stage.md: each training click
against 8 items drawn from its own history's first N retrieved candidates
(`negatives="retrieval:8"`, fresh each epoch), its weights kept at the best
validation NDCG@10 of the reordered candidates.

    python examples/two_stage.py [LOG] [WORK_DIR]

LOG defaults to the Taobao sample in ../shared/data (where it is absent: a log like it,
generated in its format, `data.synthetic --like=taobao --sample`); everything is written under
WORK_DIR (default runs/examples/two_stage). The programs behind the same steps
are `data.prepare`, `trainers.train_retrieval`, `trainers.train` and
`trainers.evaluate_cascade` (docs/two-stage.md).
"""

import os
import sys

from dare_tf import retrieval
from dare_tf.data.preparation.in_memory import prepare
from dare_tf.demo import CASCADE_TRAINING
from dare_tf.training import TrainConfig, train

HERE = os.path.dirname(os.path.abspath(__file__))
NUM_CANDIDATES = 50
SAMPLE = os.path.join(HERE, "..", "..", "shared", "data", "taobao", "UserBehavior_sample.csv")


def main(log: str = SAMPLE, work_dir: str = os.path.join("runs", "examples", "two_stage")) -> dict:
    retrieval.use_keras2()  # tensorflow-recommenders needs tf.keras to be Keras 2 (Keras 3 is unaffected)
    if log == SAMPLE and not os.path.exists(SAMPLE):
        from dare_tf.data.generation.lifelike import write_like

        log = os.path.join(work_dir, "UserBehavior_sample_like.csv")
        if not os.path.exists(log):
            write_like("taobao", log, sample=True)
        print(f"(no Taobao sample in ../shared/data: a log like it, generated, {log})")
    data_dir = os.path.join(work_dir, "data")
    prepare("taobao", log, data_dir)
    retrieval_run = os.path.join(work_dir, "retrieval")
    retrieval.train_retrieval(data_dir, retrieval_run, retrieval.RetrievalConfig(epochs=2, verbose=0,
                                                                               cascade_candidates=(NUM_CANDIDATES,)))
    train(data_dir, os.path.join(work_dir, "dare"),
          TrainConfig.create(preset="dare", verbose=0, retrieval_run=retrieval_run,
                             retrieval_candidates=NUM_CANDIDATES, **dict(CASCADE_TRAINING, batch_size=288)))
    # Prints the table: retrieval alone, then retrieval's top 50 reordered by DARE.
    return retrieval.evaluate_cascade(data_dir, retrieval_run, {"dare": os.path.join(work_dir, "dare")},
                                      os.path.join(work_dir, "cascade"), num_candidates=NUM_CANDIDATES, k=10)


if __name__ == "__main__":
    main(*sys.argv[1:3])
