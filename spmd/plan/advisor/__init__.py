"""The planner's last stage, the advisor: search sharding plans, remat policies and batches by
compiling them, rank those that fit, and write the winner as code (`advisor.advise`).

Its pieces: the candidates, their outcomes and the advice (`advice`), one mesh's search
(`search`), the compiles in parallel worker processes (`compile_pool`) and their cache on disk
(`plan_cache`).

``spmd.plan.advisor`` was one module before the planner was grouped by stage: its names are
still here.
"""

from spmd.plan.advisor.advisor import Advice, Candidate, Outcome, advise, candidates_for, default_cache_dir

__all__ = ["Advice", "Candidate", "Outcome", "advise", "candidates_for", "default_cache_dir"]
