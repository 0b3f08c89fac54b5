"""Tenant administration: `AdminClient` (the `fairgate admin` commands are `fairgate.cli.admin`)."""

from fairgate.admin.client import AdminClient

__all__ = ["AdminClient"]
