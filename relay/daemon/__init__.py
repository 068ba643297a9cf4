"""The relay daemon: its loop and socket, ingest, run table, commit and acks, bounds, counters and
status; imports relay.wire, relay.journal, relay.sinkhost and sinks."""
