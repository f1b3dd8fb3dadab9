"""Image files to pixel tensors (LLaVA's preprocessing, LaViDa's anyres views)."""
