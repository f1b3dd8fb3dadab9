"""ONNX Runtime over a multimodal export: vision.onnx for the pictures, and the step graphs fed the image table."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.contracts.graphs import IMAGE_EMBEDS, PIXEL_VALUES, VISION, GraphIO, step_graph
from seer_deploy.contracts.multimodal import MULTIMODAL_KEY
from seer_deploy.core.backend import StepInput
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.files import confined, file_sha256
from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions, open_session
from seer_deploy.models.prompts.image_placeholders import image_table_np


class MultimodalOrtBackend(OrtBackend):
    """OrtBackend over a multimodal export: `encode_images` runs vision.onnx, `set_image_table` feeds the step graphs.

    The table holds the embeddings of every image whose ids the batch's prompts carry (image_prompts.expand_placeholders
    numbers them); it stays set for all steps of a generation, whichever rows a step runs.
    """

    takes_pictures = True

    def __init__(self, export_dir: str | os.PathLike[str], options: OrtSessionOptions | None = None, *,
                 kv_cache: bool = True, manifest: ExportManifest | None = None) -> None:
        super().__init__(export_dir, options, kv_cache=kv_cache, manifest=manifest)
        section: dict[str, Any] = self.manifest.extra[MULTIMODAL_KEY]  # _declared_step_graph made sure it is there
        self.multimodal = section
        vision = section[VISION.name]
        file = confined(self.export_dir, vision["file"], "the vision graph", error=ArtifactError)
        if not file.is_file():
            raise ArtifactError(f"{file} (vision graph) is missing; the export is incomplete, re-run the export")
        if self.options.verify_hashes and file_sha256(file) != vision["sha256"]:
            raise ArtifactError(f"{file} does not match the sha256 in the manifest; re-run the export")
        self._vision = open_session(file, self.options.session_options(), self.options.resolved_providers())
        got = [i.name for i in self._vision.get_inputs()]
        if got != VISION.input_names:
            raise ArtifactError(f"{file} takes inputs {got}, not the declared {VISION.input_names}; re-run the export")
        cfg = self.manifest.model_config()
        self.width = cfg.d_model
        self.image_id_base = int(section["image_id_base"])
        self.tokens_per_image = int(section["vision_config"]["tokens_per_image"])
        self.image_token_index = int(section["vision_config"]["image_token_index"])
        self.image_size = int(section["vision_config"]["image"]["image_size"])
        self._table = np.zeros((1, self.width), dtype=np.float32)

    def _declared_step_graph(self) -> GraphIO:
        section = self.manifest.extra.get(MULTIMODAL_KEY)
        if not isinstance(section, dict) or VISION.name not in section:
            raise ArtifactError(
                f"{self.export_dir} is a text-only export (no vision graph in its manifest); export a multimodal "
                "checkpoint, or run it without images"
            )
        return step_graph(multimodal=True, prefix_dlm=self.manifest.model_config().prefix_dlm,
                          kv_cache=self.manifest.has_cache)

    def encode_images(self, pixel_values: np.ndarray) -> np.ndarray:
        """float32 [N, 3, H, W] -> float32 [N, tokens_per_image, D] (N = 0 gives an empty array)."""
        px = np.ascontiguousarray(pixel_values, dtype=np.float32)
        want = (3, self.image_size, self.image_size)
        if px.ndim != 4 or px.shape[1:] != want:
            raise ConfigError(f"{PIXEL_VALUES.name} must be [N, {', '.join(map(str, want))}], got {px.shape}")
        if px.shape[0] == 0:
            return np.zeros((0, self.tokens_per_image, self.width), dtype=np.float32)
        (out,) = self._vision.run([IMAGE_EMBEDS.name], {PIXEL_VALUES.name: px})
        return np.asarray(out)

    def set_image_table(self, table: np.ndarray | list[np.ndarray]) -> None:
        """The batch's image embeddings (one row per image token, in id order); an empty list = no images."""
        rows = image_table_np(table if isinstance(table, list) else [table], self.width)
        if rows.ndim != 2 or rows.shape[1] != self.width:
            raise ConfigError(f"the image table must be [tokens, {self.width}], got {rows.shape}")
        self._table = rows

    def _image_table(self, checked: StepInput) -> np.ndarray:
        top = int(checked.input_ids.max(initial=0))
        if top >= self.image_id_base + self._table.shape[0]:
            raise ConfigError(
                f"a prompt refers to image token {top - self.image_id_base}, but the image table has "
                f"{self._table.shape[0]} rows; call set_image_table with the batch's image embeddings first"
            )
        return self._table
