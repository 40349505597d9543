"""Policy: what a route's profile allows, and the evaluator that applies it.

``settings`` holds the frozen policy types (pure), ``load`` turns a YAML file into them through
the protobuf schema in ``protos/``, ``pressure`` computes the pressure score and level,
``evaluate`` runs the degradation ladder and ``coarse`` the ladder of a request judged without
its body; ``output_limit`` is the output a backend runs for a request, ``output_dist`` the
output lengths the pool really generates.
"""
