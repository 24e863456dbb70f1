"""Entry point of `python -m codec` (see codec/cli.py). Must not import torch, zmq or Fedge packages."""

from codec.cli import main

raise SystemExit(main())
