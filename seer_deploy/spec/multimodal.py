"""The names a multimodal export adds to a text export: the vision graph, its input and output, the step graphs'
image-table input and the manifest section that describes them."""

VISION_FILE = "vision.onnx"
IMAGE_TABLE_INPUT = "image_table"
PIXEL_INPUT = "pixel_values"
EMBEDS_OUTPUT = "image_embeds"
MULTIMODAL_KEY = "multimodal"  # the manifest's extra[...] section
