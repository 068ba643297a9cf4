"""The Prometheus endpoint (``--metrics-bind``): the metric table, collectors that read a relay's
state at scrape time, and the HTTP thread; imports relay.wire, relay.daemon, relay.fleet and
sinks.events."""
