"""Tenant administration: `AdminClient` and the `fairgate admin` commands."""

from fairgate.admin.client import AdminClient

__all__ = ["AdminClient"]
