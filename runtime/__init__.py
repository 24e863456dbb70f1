"""The composition root: the ``coordinator`` command (``cli``), the session plan that checks a configuration before
anything is written (``plan``), launching a session on a transport or a simulated fleet (``launch``), and the local
fleet of real agent processes (``localfleet``). The one package that puts coordinator, simulation and agent
processes together; nothing below it imports it."""
