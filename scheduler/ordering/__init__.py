"""Ordering: the queue policies (`QueuePolicy`: vtc, fcfs, rate-limit) over per-tenant queues."""
