"""Tenancy: tenant configuration, the tenants file, and the tenant/API-key stores."""
