"""The sink host: sink processes, their queues, the one sink driver, catch-up and replay; imports relay.journal and sinks."""
