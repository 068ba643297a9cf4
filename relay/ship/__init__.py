"""The journal's shippers: what a relay that sends its journal onward is (``Shipper``), and what
every shipper shares; imports relay.journal and sinks."""
