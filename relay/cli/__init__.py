"""The command line and its viewers (tail, follow, plot); may import every other room.

``relay consume`` (relay/cli/consume.py) is added to the ``relay`` group here, where both modules are
loaded, so that main.py need not import it back; and the Prometheus endpoint's options
(relay/cli/metrics_flags.py) to both commands."""
from relay.cli.consume import consume
from relay.cli.main import main, serve
from relay.cli.metrics_flags import metrics_params

main.add_command(consume)
serve.params.extend(metrics_params(per_run=True))
consume.params.extend(metrics_params(per_run=False))
