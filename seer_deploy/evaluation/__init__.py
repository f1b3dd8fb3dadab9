"""`seer-deploy eval`: lm-evaluation-harness tasks through the generation service, once per mode, compared with
full length on the same documents.

`modes` names the modes (the `generate` flags each stands for); `lm` is the harness model over the service; `run`
runs every (task, mode); `paired` and `report` make the table. The package itself imports nothing (lm-eval is an
optional extra): import from the module.
"""
