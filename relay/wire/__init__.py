"""The wire: frames written (encoding) and read and validated (schema), journal lines, addresses,
the relay secret, CURVE keys and how clients authenticate, and the ZeroMQ I/O thread; imports only
sinks.events."""
