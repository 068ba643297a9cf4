"""The wire: frame encoding (schema), addresses, CURVE keys and the ZeroMQ I/O thread; imports only sinks.events."""
