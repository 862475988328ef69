"""fusionwatch's service: HTTP API, CLI, and the engines that run models (ours and onnxruntime)."""
