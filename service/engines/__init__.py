"""Engines behind one Protocol: the simulator and SGLang adapters."""
