"""Entry point of `python -m fedge.codec` (see codec/cli.py). Must not import torch, zmq or Fedge packages."""

from fedge.codec.cli import main

raise SystemExit(main())
