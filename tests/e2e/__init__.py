"""End-to-end tests: the dev backend, ICE and real Envoy on loopback, checked over HTTP."""
