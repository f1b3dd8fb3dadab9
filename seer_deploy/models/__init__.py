"""Checkpoint layouts, configuration, the mask predictor, the tokenizer and the bundled demo.

Import what you need from its module (`models.checkpoints.checkpoint`, `models.text.tokenizer`, ...): this package pulls nothing in,
so a run that never touches torch (an export on ONNX Runtime) never imports it.
"""
