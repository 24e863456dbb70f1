"""``python -m fedge.edge_agent`` is the ``edge-agent`` command."""

import sys

from fedge.edge_agent.cli import main

sys.exit(main())
