"""The fscache server: listener, connections, the durable store and the lease driver."""
