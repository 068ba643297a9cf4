"""The forward sink: a node relay sending its journal to a central relay; imports relay.wire,
relay.client, relay.journal and sinks."""
