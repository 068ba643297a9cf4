"""metrics-relay sinks: the interface, the entry-point registry and the built-in sinks."""
