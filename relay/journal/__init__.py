"""The journal: the JSONL source of truth (its writer and its readers), its recovery, dedupe state and dead letters; not a sink; imports relay.wire and sinks.events."""
