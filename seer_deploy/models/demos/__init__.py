"""The bundled demo models' synthetic tasks and their data folders (demo/, demo_vl/)."""
