"""What runs inside a rank: the Publisher, its link to a relay, its send window and spool; imports
relay.wire and sinks.events."""
