"""ONNX Runtime over a multimodal export: vision.onnx for the pictures, and the step graphs fed the image table (and
for Dimple the M-RoPE positions)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.contracts.graphs import (
    IMAGE_EMBEDS,
    PIXEL_VALUES,
    QWEN_VISION,
    TOKEN_EMBEDS,
    VISION,
    GraphIO,
    step_graph,
)
from seer_deploy.contracts.multimodal import MULTIMODAL_KEY
from seer_deploy.core.backend import StepInput
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.files import confined, file_sha256
from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions, open_session
from seer_deploy.models.pictures.mrope import mrope_positions, picture_layout, text_position_shift
from seer_deploy.models.pictures.qwen_pictures import QwenPictures
from seer_deploy.models.prompts.image_placeholders import image_table_np


class MultimodalOrtBackend(OrtBackend):
    """OrtBackend over a multimodal export: `encode_images` runs vision.onnx, `set_image_table` feeds the step graphs.

    The table holds the embeddings of every image whose ids the batch's prompts carry (image_prompts.expand_placeholders
    numbers them); it stays set for all steps of a generation, whichever rows a step runs.
    """

    takes_pictures = True
    vision_graph: GraphIO = VISION  # the vision graph's declaration (a SigLIP tower's)

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
        got, declared = [i.name for i in self._vision.get_inputs()], self.vision_graph.input_names
        if got != declared:
            raise ArtifactError(f"{file} takes inputs {got}, not the declared {declared}; re-run the export")
        cfg = self.manifest.model_config()
        self.width = cfg.d_model
        self.image_id_base = int(section["image_id_base"])
        self.tokens_per_image = int(section["vision_config"]["tokens_per_image"])
        self.image_token_index = int(section["vision_config"]["image_token_index"])
        self._table = np.zeros((1, self.width), dtype=np.float32)
        self._read_vision_config(section["vision_config"])

    def _read_vision_config(self, vision_config: dict[str, Any]) -> None:
        self.image_size = int(vision_config["image"]["image_size"])

    def _declared_step_graph(self) -> GraphIO:
        section = self.manifest.extra.get(MULTIMODAL_KEY)
        if not isinstance(section, dict) or VISION.name not in section:
            raise ArtifactError(
                f"{self.export_dir} is a text-only export (no vision graph in its manifest); export a multimodal "
                "checkpoint, or run it without images"
            )
        cfg = self.manifest.model_config()
        return step_graph(multimodal=True, prefix_dlm=cfg.prefix_dlm, kv_cache=self.manifest.has_cache,
                          positions=cfg.mrope_section is not None)

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

    def _image_inputs(self, checked: StepInput) -> dict[str, np.ndarray]:
        top = int(checked.input_ids.max(initial=0))
        if top >= self.image_id_base + self._table.shape[0]:
            raise ConfigError(
                f"a prompt refers to image token {top - self.image_id_base}, but the image table has "
                f"{self._table.shape[0]} rows; call set_image_table with the batch's image embeddings first"
            )
        return {"image_table": self._table}


class DimpleOrtBackend(MultimodalOrtBackend):
    """MultimodalOrtBackend over a Dimple export: `encode_patches` runs its Qwen2.5-VL vision graph on a batch's
    pictures (inputs the host prepared, models.pictures.qwen_layout), and every step graph call gets the M-RoPE
    positions of its ids (models.pictures.mrope), from the layout `set_image_table` was given."""

    vision_graph = QWEN_VISION

    def _read_vision_config(self, vision_config: dict[str, Any]) -> None:
        self.pictures = QwenPictures.from_dict(vision_config["pictures"])
        self._layout = picture_layout([], self.pictures.geometry.merge_size)

    def encode_images(self, pixel_values: np.ndarray) -> np.ndarray:
        raise ConfigError("Dimple's vision graph takes patches (encode_patches), not square pixel views")

    def encode_patches(self, tower_inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The vision graph's inputs (models.pictures.qwen_layout.tower_inputs) -> float32 [image tokens, D]."""
        feed = {name: np.ascontiguousarray(tower_inputs[name]) for name in QWEN_VISION.input_names}
        (out,) = self._vision.run([TOKEN_EMBEDS.name], feed)
        return np.asarray(out)

    def set_image_table(self, table: np.ndarray | list[np.ndarray], layout: np.ndarray | None = None) -> None:
        """The batch's image embeddings and their places in the pictures (one row each, in id order)."""
        super().set_image_table(table)
        self._layout = picture_layout([], self.pictures.geometry.merge_size) if layout is None else layout

    def position_shift(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The cached graphs' position shift of these rows (core.backend.position_shift)."""
        return text_position_shift(input_ids, attention_mask, self.image_id_base, self._layout)

    def _image_inputs(self, checked: StepInput) -> dict[str, np.ndarray]:
        positions = mrope_positions(checked.input_ids, checked.attention_mask, self.image_id_base, self._layout)
        return {**super()._image_inputs(checked), "position_ids": positions}


def backend_class(export: ExportManifest) -> type[OrtBackend]:
    """The ONNX Runtime backend an export runs on, decided here once for the opener and the build: a text export's,
    a multimodal one's (its vision graph, the image table), or Dimple's (its Qwen2.5-VL tower and M-RoPE positions)."""
    section = export.extra.get(MULTIMODAL_KEY)
    if section is None:
        return OrtBackend
    return DimpleOrtBackend if "pictures" in section["vision_config"] else MultimodalOrtBackend
