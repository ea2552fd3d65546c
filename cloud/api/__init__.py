"""REST routers of the orchestrator, one module per resource."""
