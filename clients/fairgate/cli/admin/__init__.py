"""`fairgate admin`: the tenant administration commands (the client is `fairgate.admin`)."""
