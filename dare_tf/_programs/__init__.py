"""The installed copies of the repository's absl programs (see setup.py)."""
