"""What runs inside a rank: the Publisher, its send window and spool; imports relay.wire and sinks.events."""
