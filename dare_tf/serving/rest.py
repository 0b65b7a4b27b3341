"""TF Serving's REST Predict API (`/v1/models/NAME:predict`, the columnar
`inputs` format) as a transport of `dare_tf.serving.encoding`'s tensors.
Plain Python and numpy: a REST client loads no TensorFlow."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np

from dare_tf._faces import public
from dare_tf.serving.encoding import row_errors
from dare_tf.signatures import SERVING_DEFAULT


@public("dare_tf.serving")
def rest_predict(base_url: str, model_name: str, inputs: dict, signature: str = SERVING_DEFAULT,
                 timeout: float = 5.0) -> dict:
    """TF Serving REST predict (columnar `inputs` format); returns the `outputs` dict."""
    body = json.dumps({"signature_name": signature,
                       "inputs": {k: np.asarray(v).tolist() for k, v in inputs.items()}}).encode()
    request = urllib.request.Request(f"{base_url.rstrip('/')}/v1/models/{model_name}:predict", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = response.read()
    except urllib.error.HTTPError as e:  # (a ValueError: the programs end it in one line)
        raise ValueError(f"{base_url}: REST predict failed (HTTP {e.code}): "
                         f"{e.read().decode(errors='replace')[:500]}") from e
    except urllib.error.URLError as e:
        raise ValueError(f"{base_url}: no REST server answers ({e.reason})") from e
    try:
        outputs = json.loads(payload)["outputs"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{base_url}: not a TF Serving REST answer ({payload[:200]!r})") from e
    return row_errors(signature, outputs) if isinstance(outputs, dict) else outputs
