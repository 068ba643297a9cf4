"""The wire: frames written (encoding) and read and validated (schema), journal lines, addresses, CURVE keys and the ZeroMQ I/O thread; imports only sinks.events."""
