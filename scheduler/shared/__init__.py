"""Shared: the dispatcher of replicas that share admission state through a `Store`."""
