"""seer-deploy: export LLaDA-family diffusion LMs to ONNX / TensorRT and run them with Seer."""

__version__ = "0.1.0"
