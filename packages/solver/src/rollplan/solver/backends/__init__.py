"""Planner backends, each a module with a ``BACKEND`` object (``base.Backend`` protocol), loaded lazily by
name (``rollplan.solver.api.load_backend``): ``greedy``, ``milp`` (PuLP -> HiGHS / CBC), ``cpsat``
(OR-Tools), ``exhaustive`` (tests). ``milp`` and ``cpsat`` share ``formulation`` (the exact model and the
builder protocol), ``aggregate`` (large instances) and ``repair`` (incremental pricing, local search).

Nothing is imported here: importing the package must not pull in PuLP, HiGHS or OR-Tools.
"""
