"""The protocol's defined words: error codes, bye codes, capabilities, and the typed settings a Welcome carries.

Codes travel as short strings (readable in a packet dump and in logs), but every code either side sends is one of
the constants here, and the receiving side compares against the same constants, never against a literal spelled
again. A code is ``[a-z0-9-]``, 1 to 64 bytes; a receiver treats a well-formed code it does not know as a generic
error (so a later minor addition is not a format break). The Welcome's model and train maps are checked against
``MODEL_FIELDS`` and ``TRAIN_FIELDS`` when a Welcome is built or decoded. docs/wire-format.md section 3 is the
prose form of this module.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

import re

CODE_PATTERN = re.compile(r"[a-z0-9-]{1,64}")

# ErrorMessage codes a coordinator sends.
MALFORMED = "malformed"                  # the packet did not decode
SENDER_MISMATCH = "sender-mismatch"      # the packet's sender is not the connection's routing id
IDENTITY_MISMATCH = "identity-mismatch"  # the routing id is not the client id the connection's key is allowed as
HELLO_FIRST = "hello-first"              # a message from an agent that has not registered in this session
PROTOCOL_MISMATCH = "protocol-mismatch"  # the agent speaks another wire-format version
MODEL_MISMATCH = "model-mismatch"        # the agent's model definition differs (also sent by an agent, at a welcome)
SESSION_FULL = "session-full"            # every client index is taken
STALE = "stale"                          # an update for a round that is not open
NOT_SELECTED = "not-selected"            # an update from a client not selected in the round
DUPLICATE = "duplicate"                  # a second update from a client in one round
INVALID_UPDATE = "invalid-update"        # an update whose tensors do not fit the model or the masks sent
UNEXPECTED = "unexpected"                # a kind an agent does not send (a Task, a Welcome, ...)

# ErrorMessage codes an agent sends.
ROUND_FAILED = "round-failed"            # it could not do the round named in the message (its task, its training)
PLUGIN_REFUSED = "plugin-refused"        # the welcome names a plugin this device's rule does not admit
PLUGIN_MISMATCH = "plugin-mismatch"      # the plugin installed here is another distribution or version
DATA_MISMATCH = "data-mismatch"          # this device's data does not fit the session's model or task
MODEL_FAILED = "model-failed"            # the session's model or loss cannot be built here
NO_NORMALIZATION = "no-normalization"    # data from a callable, and the session carries no normalisation
BAD_WELCOME = "bad-welcome"              # the welcome's settings cannot be used
UNAVAILABLE = "unavailable"              # this device may not train now (its availability rules): not a failure

# The codes with which an agent declines a session at its welcome: the coordinator frees the client index the agent
# took, so that another device can have it.
JOIN_REFUSALS = frozenset({PLUGIN_REFUSED, PLUGIN_MISMATCH, DATA_MISMATCH, MODEL_MISMATCH, MODEL_FAILED,
                           NO_NORMALIZATION, BAD_WELCOME})
# The coordinator's session-level refusals: the agent backs off and says hello again later.
SESSION_REFUSALS = frozenset({PROTOCOL_MISMATCH, MODEL_MISMATCH, SESSION_FULL, IDENTITY_MISMATCH})
ERROR_CODES = frozenset({MALFORMED, SENDER_MISMATCH, IDENTITY_MISMATCH, HELLO_FIRST, PROTOCOL_MISMATCH, MODEL_MISMATCH, SESSION_FULL,
                         STALE, NOT_SELECTED, DUPLICATE, INVALID_UPDATE, UNEXPECTED, ROUND_FAILED,
                         UNAVAILABLE}) | JOIN_REFUSALS

# Bye codes.
BYE_FINISHED = "finished"  # the session is over: an agent that receives it stops (exit 0)
BYE_STOPPING = "stopping"  # the sender stops and may come back (a coordinator that will resume, an agent going down)
BYE_CODES = frozenset({BYE_FINISHED, BYE_STOPPING})

# Capabilities a Hello may list beyond the wire format's minimum.
TASK_PARTS = "task-parts"  # a Task may come in several ZeroMQ frames, its header then its body (the packet: all joined)

# A Welcome's model map: exactly these keys with these types (``options`` is the model factory's own map).
MODEL_FIELDS = {"name": "str", "input_shape": "ints", "num_classes": "int", "pan": "str", "pan_a": "float",
                "pan_t": "float", "options": "map"}
# A Welcome's train map: exactly these keys with these types.
TRAIN_FIELDS = {"epochs": "int", "batch_size": "int", "lr": "float", "optimizer": "str", "momentum": "float",
                "weight_decay": "float", "loss": "str", "class_weights": "floats"}
