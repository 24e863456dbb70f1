"""`python -m fldata partition ...`: the data tools without the coordinator. Holds no logic of its own."""

from fldata.cli import main

raise SystemExit(main())
