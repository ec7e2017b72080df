"""Parallel Dyna-Q: the world model (:mod:`.world_model`) and the imagined env planners roll it in
(:mod:`.imagined_env`). Imports torch: services import it only when ``planning.enabled``."""
