"""The contracts between an export and whoever runs it: what each graph takes and returns (`graphs`), how the
backends feed it and read it (`graph_calls`, `sampling`), and the export's manifest (`export_manifest`,
`manifest_sections`, `multimodal`). Tracing, validation, ONNX Runtime and TensorRT all read them from here."""
