"""The service's use cases, a module each (admit, release, resize). They decide
through the pure core and commit through the commit unit; they reach
everything else through the ports of `ports.py`, never an adapter
(tests/test_import_graph.py)."""
