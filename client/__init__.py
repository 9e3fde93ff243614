"""The fscache client: connection, lease cache, blocking facade."""
