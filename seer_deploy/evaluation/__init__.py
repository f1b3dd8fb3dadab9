"""`seer-deploy eval`: lm-evaluation-harness or lmms-eval tasks through the generation service, once per mode,
compared with full length on the same documents.

`modes` names the modes (the `generate` flags each stands for); `answering` is one mode's answers through the
service, which both harnesses' model classes use (`lm`: lm-eval's, `lmms`: lmms-eval's); `tasks` says which harness
loads and scores the tasks; `run` runs every (task, mode); `paired` and `report` make the table. The package itself
imports nothing (the harnesses are optional extras): import from the module.
"""
