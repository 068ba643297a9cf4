"""The sink host: sink processes and their fan-out, their queues, the one sink driver, catch-up and
replay; imports relay.journal and sinks."""
