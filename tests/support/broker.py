"""The tests' broker is the product's local Mosquitto launcher (the benchmarks use it too)."""

from edgefleet.bench.mosquitto import MosquittoBroker, free_port, wait_for_port

__all__ = ["MosquittoBroker", "free_port", "wait_for_port"]
