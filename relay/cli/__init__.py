"""The command line and its viewers (tail, follow, plot); may import every other room.

``relay consume`` (relay/cli/consume.py) is added to the ``relay`` group here, where both modules are
loaded, so that main.py need not import it back."""
from relay.cli.consume import consume
from relay.cli.main import main

main.add_command(consume)
