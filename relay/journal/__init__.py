"""The journal: the JSONL source of truth, its recovery, dedupe state and dead letters; imports relay.wire and sinks."""
