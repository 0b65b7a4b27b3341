"""The installed copies of the repository's absl programs and flagfiles (see
setup.py): `dare_tf._programs.{data,serving,trainers,configs}`.

In a checkout, or an editable install of one, the folders of those names
beside the package are found instead (this package's `__path__`)."""

import os as _os

_CHECKOUT = _os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
if not _os.path.isdir(_os.path.join(_os.path.dirname(__file__), "trainers")) and \
        _os.path.isfile(_os.path.join(_CHECKOUT, "trainers", "train.py")):
    __path__.append(_CHECKOUT)
