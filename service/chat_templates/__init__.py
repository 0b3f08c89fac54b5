"""Chat templates shipped with fairgate (package data)."""
