"""`python -m fedge.fldata partition ...`: the data tools without the coordinator. Holds no logic of its own."""

from fedge.fldata.cli import main

raise SystemExit(main())
