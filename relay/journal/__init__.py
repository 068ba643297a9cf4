"""The journal: the JSONL source of truth (its writer, its readers, the queue of lines waiting for
one write), its recovery, dedupe state, stream writers and dead letters; not a sink; imports
relay.wire and sinks.events."""
