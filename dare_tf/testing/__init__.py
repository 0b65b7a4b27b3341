"""Test doubles, not public API: `standin_server`, a stand-in for TensorFlow
Serving over the official PredictionService protos (the TensorFlow Serving
binary cannot be installed on every build machine). The tests, the demo and
the serving benchmarks use it; deploy the real `tensorflow/serving`
(docs/serving.md)."""
