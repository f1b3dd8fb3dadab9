"""What a multimodal export adds to a text export's manifest: the section that describes the vision graph and the
image settings. The graphs' tensors (the vision graph's, the step graphs' image table) are declared in contracts.graphs."""

from seer_deploy.contracts.graphs import VISION

MULTIMODAL_KEY = "multimodal"  # the manifest's extra[...] section
VISION_FILE = VISION.file  # the vision graph's file, for listings (cli.export)
