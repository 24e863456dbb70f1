"""The operator's dashboard: ``coordinator dashboard [RUNS_DIR | RUN] --listen HOST:PORT``.

A read-only web page over run directories (docs/dashboard.md): ``runfiles`` reads a run's files as they grow,
``runs`` finds runs and shapes what the page shows, ``server`` serves the page and its JSON with the security rules
(loopback by default, a token elsewhere, GET and HEAD only), ``static/`` holds the page and the chart library it
ships with (uPlot, vendored: static/VENDOR.json). It reads files a coordinator writes and never writes to a run
directory, so a running coordinator carries no extra load. Imports nothing of Fedge but ``fedge.plumbing``, and
never imports torch, zmq or numpy itself (``fedge.plumbing`` loads numpy).
"""
