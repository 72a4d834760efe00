"""The service's use cases, a module each (admit, release, resize). They decide
through the pure core and commit through the commit unit; they reach
everything else through the ports of `ports.py`, never an adapter
(tests/test_import_graph.py). Start-up's rebuild is recovery.py and
rebuild.py, given their ports as arguments before the service is made;
AgentService.install commits its result (docs/architecture.md)."""
