"""`make bench`: optimizer and executor timings next to onnxruntime's (see bench/__main__.py)."""
