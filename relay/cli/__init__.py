"""The command line and its viewers (tail, follow, plot); may import every other room.

``relay consume`` (relay/cli/consume.py) and the viewers (relay/cli/viewers.py) are added to the
``relay`` group here, where every module is loaded, so that main.py need not import them back; and
the Prometheus endpoint's options (relay/cli/metrics_flags.py) to serve and consume."""
from relay.cli.consume import consume
from relay.cli.main import main, serve
from relay.cli.metrics_flags import metrics_params
from relay.cli.viewers import plot, runs, tail

for command in (consume, tail, runs, plot):
    main.add_command(command)
serve.params.extend(metrics_params(per_run=True))
consume.params.extend(metrics_params(per_run=False))
