"""Planner backends, each a module with a ``BACKEND`` object (``base.Backend`` protocol), loaded lazily by
name (``rollplan.solver.api.load_backend``): ``greedy`` (``search.placement``), ``milp`` (PuLP -> HiGHS /
CBC), ``cpsat`` (OR-Tools), ``exhaustive`` (tests). ``milp`` and ``cpsat`` are builders of the one model
(``rollplan.solver.model``) run by the same ``pipeline`` (exact model when small; aggregate, disaggregation
and local search when large).

Nothing is imported here: importing the package must not pull in PuLP, HiGHS or OR-Tools.
"""
