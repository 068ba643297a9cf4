"""The fleet tier over NATS JetStream (connection, stream, the nats sink); imports relay.wire,
relay.journal, relay.sinkhost and sinks."""
