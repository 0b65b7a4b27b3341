"""The search stage (stage 1) as a family: one `BehaviorSearch` subclass per variant.

| `ModelConfig.search` | class | models |
|---|---|---|
| `soft` | `SoftTopKSearch` | TWIN, DARE and their ablations |
| `hard` | `HardTopKSearch` | TWIN-hard |
| `simhash` | `SimHashTopKSearch` | ETA |
| `cluster` | `ClusterTopKSearch` | TWIN-V2 |
| `sdim` | `HashSamplingSearch` | SDIM |
| `none` | `FullHistorySearch` | DIN |

A new variant is one module here with a `@register_search("name")` subclass,
its test, and a preset line in `dare_tf.config.PRESETS`.
"""

from dare_tf.search.base import (PADDING_SCORE, SEARCHES, BehaviorSearch, TopKSearch, build_search, register_search,
                                 scaled_dot_scores, search_class)
from dare_tf.search.soft import SoftTopKSearch
from dare_tf.search.hard import HardTopKSearch, hard_search_priority
from dare_tf.search.simhash import SimHashTopKSearch, hamming_priority
from dare_tf.search.cluster import ClusterTopKSearch
from dare_tf.search.sampling import HashSamplingSearch
from dare_tf.search.full_history import FullHistorySearch

__all__ = [
    "PADDING_SCORE",
    "SEARCHES",
    "BehaviorSearch",
    "ClusterTopKSearch",
    "FullHistorySearch",
    "HardTopKSearch",
    "HashSamplingSearch",
    "SimHashTopKSearch",
    "SoftTopKSearch",
    "TopKSearch",
    "build_search",
    "hamming_priority",
    "hard_search_priority",
    "register_search",
    "scaled_dot_scores",
    "search_class",
]
