"""The command line and its viewers (tail, follow, plot); may import every other room.

``relay consume`` (relay/cli/consume.py) and the viewers (relay/cli/viewers.py) are added to the
``relay`` group here, where every module is loaded, so that main.py need not import them back; and
the Prometheus endpoint's options (relay/cli/metrics_flags.py) to serve and consume. A SIGTERM while
the program imports is held until its command is known (relay/cli/sigterm.py)."""
from relay.cli import sigterm

sigterm.defer()

from relay.cli.consume import consume  # noqa: E402  (after defer: imports take a while)
from relay.cli.main import main, serve  # noqa: E402
from relay.cli.metrics_flags import metrics_params  # noqa: E402
from relay.cli.viewers import plot, runs, tail  # noqa: E402

for command in (consume, tail, runs, plot):
    main.add_command(command)
serve.params.extend(metrics_params(per_run=True))
consume.params.extend(metrics_params(per_run=False))
