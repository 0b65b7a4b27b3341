"""dare-tf: DARE (ICLR 2025) and its baselines as Keras 3 layers and programs."""

from setuptools import find_packages, setup

setup(
    name="dare-tf",
    version="0.1.0",
    description="Decoupled-embedding long-sequence recommendation (DARE, TWIN, DIN) in Keras 3",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["dare_tf*", "trainers*", "serving*", "data*"]),
    python_requires=">=3.10",
    install_requires=[
        "tensorflow>=2.16,<2.22",
        "keras>=3.3",
        "tensorflow-serving-api>=2.16",
        "numpy",
        "absl-py",
        "tqdm",
        "pyarrow>=14",
        "tensorboard>=2.16",
    ],
    extras_require={"test": ["pytest"], "plot": ["matplotlib"]},
    entry_points={
        "console_scripts": [
            "dare-prepare=data.prepare:run",
            "dare-synthetic=data.synthetic:run",
            "dare-train=trainers.train:run",
            "dare-reproduce=trainers.reproduce:run",
            "dare-export=serving.export:run",
            "dare-client=serving.client:run",
        ]
    },
)
